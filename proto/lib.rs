//! gyre's gRPC API: the `gyre.v1` package compiled from `proto/gyre/v1/*.proto`.
//!
//! Clients and the service both depend on this crate; it holds only generated
//! code and the descriptor set that server reflection needs.

/// The `gyre.v1` package: messages, the `Generation` client and server.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("gyre.v1");
}

/// Encoded `FileDescriptorSet` of the gyre.v1 protos, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/gyre_v1_descriptor.bin"));
