//! gyre's gRPC service over the engine, and the pieces of the `gyre` binary.
//!
//! Text work lives here, off the engine thread: chat templates, tokenizing,
//! incremental detokenizing, stop strings, reasoning sections and tool calls,
//! one output pipeline per choice (`pipeline`). Errors map to `tonic::Status` in
//! exactly one place (`error`). The Responses API (`responses`) is a third
//! output format over the same generation, with its own store.

pub mod access;
pub mod admin;
mod beam;
pub mod chat;
mod choice;
pub mod compact;
pub mod deep_health;
pub mod detok;
pub mod embeddings;
pub mod embeddings_grpc;
pub mod error;
pub mod grpc;
pub mod health;
pub mod holdback;
pub mod keys;
pub mod limit_headers;
pub mod metrics;
pub mod multiplex;
pub mod observe;
pub mod pipeline;
pub mod quota;
pub mod reasoning;
pub mod registry;
pub mod request;
pub mod resolve;
pub mod responses;
pub mod runtime;
pub mod server;
pub mod stop;
pub mod structured;
pub mod template;
pub mod tenant;
pub mod tools;
