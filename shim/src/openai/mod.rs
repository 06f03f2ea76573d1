//! The OpenAI HTTP API's JSON shapes, as serde types: [`request`] bodies the
//! shim accepts and [`response`] objects it sends, [`embeddings`] for
//! `/v1/embeddings`, and [`int`], integers that JSON may spell as whole
//! floats; `responses_*`, the Responses API's request, input items, output
//! objects and stream events, which map straight to and from the generated
//! gyre.v1 types.

pub mod embeddings;
pub mod int;
pub mod request;
pub mod response;
pub mod responses_events;
pub mod responses_input;
pub mod responses_output;
pub mod responses_request;
