//! The OpenAI HTTP API's JSON shapes, as serde types: [`request`] bodies the
//! shim accepts and [`response`] objects it sends, [`embeddings`] for
//! `/v1/embeddings`, and [`int`], integers
//! that JSON may spell as whole floats. Nothing here knows gRPC.

pub mod embeddings;
pub mod int;
pub mod request;
pub mod response;
