//! gyre's gRPC service over the engine, and the pieces of the `gyre` binary.
//!
//! Text work lives here, off the engine thread: chat templates, tokenizing,
//! incremental detokenizing, stop strings, reasoning sections. Errors map to `tonic::Status` in
//! exactly one place (`error`).

pub mod chat;
pub mod compact;
pub mod detok;
pub mod error;
pub mod grpc;
pub mod multiplex;
pub mod reasoning;
pub mod request;
pub mod resolve;
pub mod runtime;
pub mod server;
pub mod stop;
pub mod structured;
pub mod template;
pub mod tools;
