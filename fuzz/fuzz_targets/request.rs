//! Request parsing of the OpenAI HTTP API (`shim/src/extract.rs`,
//! `shim/src/convert.rs`): a body as the shim receives it, parsed as a chat
//! and as a completions request and converted to `gyre.v1.Request`s.
//!
//! Properties: no panic; every refusal is a 4xx in the OpenAI error shape
//! (all four keys, `message` and `type` strings) whose message stays short
//! (input it repeats is clipped, so an error never grows with the input);
//! every proto request the shim builds encodes and decodes back to itself
//! with prost's default limits, as the gRPC service will decode it.
#![no_main]

use gyre_api::v1 as pb;
use gyre_shim::convert::{ChatRequest, CompletionRequest};
use gyre_shim::error::ApiError;
use gyre_shim::extract::parse_object;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// Longest acceptable error message: fixed text plus at most
/// `gyre_api::clip`'s 256 characters of repeated input (4 bytes each).
const MAX_MESSAGE_BYTES: usize = 2048;

fn check_refusal(err: &ApiError, input: &[u8]) {
    let status = err.status();
    assert!(
        status.is_client_error(),
        "HTTP {status} for {:?}",
        String::from_utf8_lossy(input)
    );
    let body = err.body();
    let error = &body["error"];
    let mut keys: Vec<&str> = error
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "param", "type"],
        "error shape {body}"
    );
    assert!(error["type"].is_string(), "error type {body}");
    assert!(
        error["param"].is_string() || error["param"].is_null(),
        "param {body}"
    );
    assert!(
        error["code"].is_string() || error["code"].is_null(),
        "code {body}"
    );
    let Some(message) = error["message"].as_str() else {
        panic!("error message {body}");
    };
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "a {}-byte error message for a {}-byte body: {:.300}",
        message.len(),
        input.len(),
        message
    );
}

fn check_proto(request: &pb::Request) {
    let bytes = request.encode_to_vec();
    match pb::Request::decode(bytes.as_slice()) {
        Ok(back) => assert_eq!(&back, request, "the proto request does not round-trip"),
        Err(e) => {
            let shown = format!("{request:?}");
            let cut = shown
                .char_indices()
                .nth(2000)
                .map_or(shown.len(), |(at, _)| at);
            panic!(
                "the service could not decode this request ({:.600}): {}",
                e.to_string(),
                &shown[..cut]
            )
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let body = match parse_object(data) {
        Ok(body) => body,
        Err(e) => return check_refusal(&e, data),
    };
    match ChatRequest::from_body(&body).and_then(|r| r.into_proto("fuzz")) {
        Ok((request, _)) => check_proto(&request),
        Err(e) => check_refusal(&e, data),
    }
    match CompletionRequest::from_body(&body).and_then(|r| r.into_protos("fuzz")) {
        Ok((requests, _)) => requests.iter().for_each(check_proto),
        Err(e) => check_refusal(&e, data),
    }
});
