//! The OpenAI HTTP API's JSON shapes, as serde types: [`request`] bodies the
//! shim accepts and [`response`] objects it sends. Nothing here knows gRPC.

pub mod request;
pub mod response;
