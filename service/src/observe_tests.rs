//! Unit tests of `observe`: request ids and the parent trace context.

use super::*;

#[test]
fn a_usable_request_id_is_kept_and_others_replaced() {
    let mut req = tonic::Request::new(());
    req.metadata_mut()
        .insert(REQUEST_ID, "abc-1".parse().expect("ascii"));
    assert_eq!(RequestObs::start(&req, "m").id, "abc-1");
    req.metadata_mut()
        .insert(REQUEST_ID, "a b".parse().expect("ascii"));
    let generated = RequestObs::start(&req, "m").id.clone();
    assert!(uuid::Uuid::parse_str(&generated).is_ok(), "{generated}");
}

#[test]
fn the_parent_comes_from_traceparent() {
    let mut meta = tonic::metadata::MetadataMap::new();
    meta.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .expect("ascii"),
    );
    let cx = parent_of(&meta);
    let sc = cx.span().span_context().clone();
    assert_eq!(
        sc.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
}
