use tonic::Code;
use tonic::service::Interceptor as _;
use tonic_types::StatusExt as _;

use super::*;
use crate::v1;

#[test]
fn params_build_the_wire_request_and_leave_unset_fields_unset() {
    let r = Params::new().request("Hi");
    assert_eq!(r.input, Some(v1::request::Input::Text("Hi".into())));
    assert_eq!(r.model, "");
    assert_eq!(r.request_id, "");
    assert_eq!(r.sampling, None);
    assert_eq!((r.max_tokens, r.n, r.ignore_eos), (None, None, false));

    let r = Params::new()
        .model("m")
        .request_id("r1")
        .max_tokens(16)
        .temperature(0.0)
        .seed(7)
        .stop("\n")
        .ignore_eos(true)
        .n(2)
        .request(vec![1u32, 2, 3]);
    assert_eq!(
        r.input,
        Some(v1::request::Input::TokenIds(v1::TokenIds {
            ids: vec![1, 2, 3]
        }))
    );
    assert_eq!((r.model.as_str(), r.request_id.as_str()), ("m", "r1"));
    let s = r.sampling.expect("sampling set");
    assert_eq!((s.temperature, s.seed, s.top_p), (Some(0.0), Some(7), None));
    assert_eq!((r.max_tokens, r.n, r.ignore_eos), (Some(16), Some(2), true));
    assert_eq!(r.stop, vec!["\n".to_string()]);
}

#[test]
fn chat_messages_build_chat_input() {
    let r = Params::new().request(vec![
        Message::system("Be brief."),
        Message::user("Hi").name("ann"),
        Message::assistant("Hello."),
        Message::tool("call-1", "42"),
    ]);
    let Some(v1::request::Input::Chat(chat)) = r.input else {
        panic!("not chat input: {:?}", r.input);
    };
    let roles: Vec<_> = chat.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(chat.messages[1].content.as_deref(), Some("Hi"));
    assert_eq!(chat.messages[1].name.as_deref(), Some("ann"));
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("call-1"));
    assert_eq!(chat.add_generation_prompt, None);
}

#[test]
fn a_status_becomes_a_typed_error_with_gyres_details() {
    let mut details = tonic_types::ErrorDetails::new();
    details.set_error_info(
        "MODEL_NOT_FOUND",
        "gyre.v1",
        std::collections::HashMap::new(),
    );
    details.add_bad_request_violation("model", "no such model");
    details.set_retry_info(Some(Duration::from_secs(2)));
    let status =
        tonic::Status::with_error_details(Code::NotFound, "the model `x` does not exist", details);
    let e = Error::from(status);
    assert_eq!(e.code(), Some(Code::NotFound));
    let api = e.api().expect("an API error");
    assert_eq!(api.reason.as_deref(), Some("MODEL_NOT_FOUND"));
    assert_eq!(api.field.as_deref(), Some("model"));
    assert_eq!(api.retry_after, Some(Duration::from_secs(2)));
    assert_eq!(
        e.to_string(),
        "NOT_FOUND (MODEL_NOT_FOUND): the model `x` does not exist [field model]"
    );
    // A status without details (e.g. from a proxy) keeps code and message.
    let e = Error::from(tonic::Status::unauthenticated("missing API key"));
    assert_eq!(e.to_string(), "UNAUTHENTICATED: missing API key");
    assert_eq!(e.api().and_then(|a| a.reason.clone()), None);
}

fn response(id: &str, event: v1::generate_response::Event) -> v1::GenerateResponse {
    v1::GenerateResponse {
        request_id: id.into(),
        index: 0,
        event: Some(event),
    }
}

#[test]
fn wire_events_become_typed_events_and_request_errors() {
    use v1::generate_response::Event as E;
    let d = event_of(response(
        "a",
        E::Delta(v1::Delta {
            text: "Hi".into(),
            token_ids: vec![5],
            ..Default::default()
        }),
    ));
    assert!(
        matches!(d, Some(Ok(Event::Delta(Delta { ref text, ref token_ids, .. })))
        if text == "Hi" && token_ids == &[5])
    );
    let f = event_of(response(
        "a",
        E::Finish(v1::Finish {
            reason: v1::FinishReason::Cancelled as i32,
            usage: Some(v1::Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
                ..Default::default()
            }),
            ..Default::default()
        }),
    ));
    let Some(Ok(Event::Finish(f))) = f else {
        panic!("not a finish: {f:?}");
    };
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::Cancelled, 1)
    );
    assert_eq!(FinishReason::Cancelled.to_string(), "cancelled");
    let unknown = event_of(response(
        "a",
        E::Finish(v1::Finish {
            reason: 99,
            ..Default::default()
        }),
    ));
    assert!(matches!(
        unknown,
        Some(Ok(Event::Finish(Finish {
            reason: FinishReason::Other(99),
            ..
        })))
    ));

    let err = event_of(response(
        "b",
        E::Finish(v1::Finish {
            reason: v1::FinishReason::Error as i32,
            error: Some(v1::RequestError {
                code: Code::NotFound as i32,
                message: "the model `x` does not exist".into(),
                reason: "MODEL_NOT_FOUND".into(),
                field: "model".into(),
            }),
            ..Default::default()
        }),
    ));
    let Some(Err(Error::Api(api))) = err else {
        panic!("not an error: {err:?}");
    };
    assert_eq!(api.code, Code::NotFound);
    assert_eq!(api.request_id.as_deref(), Some("b"));
    assert_eq!(api.reason.as_deref(), Some("MODEL_NOT_FOUND"));

    let rejected = event_of(response(
        "dup",
        E::Rejected(v1::Rejected {
            error: Some(v1::RequestError {
                code: Code::AlreadyExists as i32,
                message: "request_id `dup` is already running".into(),
                reason: "DUPLICATE_REQUEST_ID".into(),
                field: "start.request_id".into(),
            }),
        }),
    ));
    assert_eq!(
        rejected.and_then(|r| r.err()).and_then(|e| e.code()),
        Some(Code::AlreadyExists)
    );
    // A message without an event (a newer kind) is skipped, not an error.
    assert!(
        event_of(v1::GenerateResponse {
            request_id: "a".into(),
            index: 0,
            event: None
        })
        .is_none()
    );
}

#[test]
fn bad_settings_are_config_errors_not_panics() {
    let config = |b: Builder| match b.endpoint() {
        Err(Error::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert!(config(Builder::new("https://example.com:443")).contains("CA certificate"));
    assert!(config(Builder::new("http://h:1").tls(Tls::new(b"x".to_vec()))).contains("https://"));
    assert!(config(Builder::new("ftp://h:1")).contains("ftp"));
    assert!(config(Builder::new("http://bad host:1")).contains("bad server URL"));
    assert!(config(Builder::new("https://h:1").tls(Tls::new(b"not pem".to_vec()))).contains("PEM"));
    assert!(matches!(
        Tls::ca_file("/nonexistent/ca.pem"),
        Err(Error::Config(m)) if m.contains("/nonexistent/ca.pem")
    ));
    for key in ["", "line\nbreak", "clé", "two words"] {
        assert!(matches!(ApiKey::new(key), Err(Error::Config(_))), "{key:?}");
    }
    // A bare host:port is http, or https with TLS.
    let (e, tls) = Builder::new("127.0.0.1:50051")
        .endpoint()
        .expect("a valid endpoint");
    assert_eq!(e.uri().scheme_str(), Some("http"));
    assert!(tls.is_none());
}

/// A throwaway self-signed P-256 certificate for `gyre.test` and its
/// key (`openssl req -x509 -newkey ec ... -subj "/CN=gyre test CA"`):
/// only parsed here; the handshake itself is tested end to end
/// (tests/test_rust_client.py).
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\n\
MIIBmjCCAUGgAwIBAgIUToOuchGrVZwWUG+3J2+9LeyXcOAwCgYIKoZIzj0EAwIw\n\
FzEVMBMGA1UEAwwMZ3lyZSB0ZXN0IENBMCAXDTI2MTEyNjA5NTEwOFoYDzIxMjYx\n\
MTAyMDk1MTA4WjAXMRUwEwYDVQQDDAxneXJlIHRlc3QgQ0EwWTATBgcqhkjOPQIB\n\
BggqhkjOPQMBBwNCAASt68rN2TSr7oRBBUI4AnbPG7cOTmSCEpHKAwARE8xI56ex\n\
StXlfohVtTAjPfZ1ALBa7XZs2FLeyi3xHTvg9o7bo2kwZzAdBgNVHQ4EFgQU0YOI\n\
HglWciNAlT8dAHvy2s/vaYwwHwYDVR0jBBgwFoAU0YOIHglWciNAlT8dAHvy2s/v\n\
aYwwDwYDVR0TAQH/BAUwAwEB/zAUBgNVHREEDTALgglneXJlLnRlc3QwCgYIKoZI\n\
zj0EAwIDRwAwRAIgLx/s8sEqun9Lxe2khnwp8kiW6SgHwFakni/2BE3WKWQCIGSD\n\
Z38dkJyv1u8DEpW+CrsjKzBGxfz4cCsFtL2LaLfp\n\
-----END CERTIFICATE-----\n\
";
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgvLZqQPsGMX3aoKqh\n\
7NRQkBy/wVX07zMNXdpuhiik5jqhRANCAASt68rN2TSr7oRBBUI4AnbPG7cOTmSC\n\
EpHKAwARE8xI56exStXlfohVtTAjPfZ1ALBa7XZs2FLeyi3xHTvg9o7b\n\
-----END PRIVATE KEY-----\n\
";

#[test]
fn tls_settings_make_an_h2_connector_or_a_config_error() {
    let tls = |b: Builder| b.endpoint().map(|(_, c)| format!("{c:?}"));
    let connector =
        tls(Builder::new("https://127.0.0.1:1").tls(Tls::new(CA_PEM))).expect("a valid CA");
    assert!(connector.contains("alpn: [[104, 50]]"), "{connector}");
    assert!(connector.contains("server_name: None"), "{connector}");
    // A bare host:port with TLS is https.
    let connector = tls(Builder::new("127.0.0.1:1").tls(
        Tls::new(CA_PEM)
            .identity(CA_PEM, KEY_PEM)
            .domain_name("gyre.test"),
    ))
    .expect("a valid identity");
    assert!(connector.contains(r#"DnsName("gyre.test")"#), "{connector}");

    let config = |b: Builder| match tls(b) {
        Err(Error::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    };
    let with = |t: Tls| config(Builder::new("https://h:1").tls(t));
    let m = with(Tls::new(CA_PEM).identity(CA_PEM, "not a key"));
    assert!(m.starts_with("the client key"), "{m}");
    let m = with(Tls::new(CA_PEM).identity("not a certificate", KEY_PEM));
    assert!(m.starts_with("the client certificate is not PEM"), "{m}");
    let m = with(Tls::new(CA_PEM).domain_name("not a name"));
    assert!(m.starts_with("TLS domain name `not a name`"), "{m}");
    let broken = CA_PEM.replace("MIIB", "!!!!");
    let m = with(Tls::new(broken));
    assert!(m.starts_with("the CA certificate"), "{m}");
}

#[test]
fn the_interceptor_adds_the_bearer_key_and_hides_it_in_debug() {
    let mut key = ApiKey::new("sekret").expect("a valid key");
    let r = key
        .call(tonic::Request::new(()))
        .expect("the interceptor never fails");
    let value = r
        .metadata()
        .get("authorization")
        .expect("authorization set");
    assert_eq!(value.to_str().ok(), Some("Bearer sekret"));
    assert!(crate::auth::bearer_matches(
        value.to_str().unwrap_or_default(),
        "sekret"
    ));
    assert!(!format!("{key:?}").contains("sekret"));
    assert!(!format!("{:?}", Builder::new("h:1").api_key("sekret")).contains("sekret"));
    let r = ApiKey::default()
        .call(tonic::Request::new(()))
        .expect("the interceptor never fails");
    assert!(r.metadata().get("authorization").is_none());
}
