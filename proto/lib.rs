//! gyre's gRPC API: the `gyre.v1` package compiled from `proto/gyre/v1/*.proto`.
//!
//! Clients and the service both depend on this crate; it holds the generated
//! code, the descriptor set that server reflection needs, the codec the
//! generated code uses (`codec`), and what both protocols share about client
//! input: the API-key check (`auth`) and how much of it an error may repeat
//! (`clip`). With the default `client` feature it also holds [`client`], a
//! typed convenience layer over the generated `Generation` client, and with
//! `tls` (which `client` turns on) [`tls`], the rustls connector of every
//! gyre gRPC client that reaches an `https://` address.

pub mod auth;
#[cfg(feature = "client")]
pub mod client;
pub mod codec;
#[cfg(feature = "tls")]
pub mod tls;

/// The `gyre.v1` package: messages, the `Generation`, `Embeddings` and
/// `Responses` clients and servers.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("gyre.v1");
}

/// Encoded `FileDescriptorSet` of the gyre.v1 protos, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/gyre_v1_descriptor.bin"));

/// Longest piece of client input, in characters, that an error message may
/// repeat back (on either protocol); longer input is cut.
pub const MAX_ECHO_CHARS: usize = 256;

/// `s` as an error message may quote it: at most [`MAX_ECHO_CHARS`]
/// characters, cut on a character boundary, with "…" marking a cut. Keeps a
/// client's input from growing a gRPC status (sent as a header) without bound.
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(MAX_ECHO_CHARS) {
        None => std::borrow::Cow::Borrowed(s),
        Some((end, _)) => std::borrow::Cow::Owned(format!("{}…", &s[..end])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_input_and_cuts_long_input_on_a_char_boundary() {
        assert_eq!(clip("gpt-4o"), "gpt-4o");
        let exact = "é".repeat(MAX_ECHO_CHARS);
        assert_eq!(clip(&exact), exact.as_str());
        let long = "é".repeat(MAX_ECHO_CHARS + 5000);
        let cut = clip(&long);
        assert_eq!(cut.chars().count(), MAX_ECHO_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert!(cut.starts_with(&"é".repeat(MAX_ECHO_CHARS)));
    }
}
