//! The service honours a call's `grpc-timeout`: a generation still running
//! when the deadline passes ends with DEADLINE_EXCEEDED and its sequence is
//! cancelled in the engine. The client here only sends the header and does
//! not enforce it, so only the server can end the stream.

mod common;
use std::path::PathBuf;
use std::sync::Arc;

use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{self, GetStatsRequest, generate_response::Event, request::Input};
use gyre_engine::{DeviceChoice, EngineOptions};
use gyre_service::runtime::ModelRuntime;
use tokio::net::TcpListener;

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-qwen2")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_deadline_ends_with_deadline_exceeded() {
    let mut opts = EngineOptions::new(model_dir());
    opts.device = DeviceChoice::Cpu;
    let rt =
        tokio::task::spawn_blocking(move || ModelRuntime::load(opts, None, Default::default()))
            .await
            .expect("join")
            .expect("model loads (build fixtures with `make models`)");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(common::serve_grpc(
        listener,
        vec![Arc::new(rt)],
        None,
        tokio::sync::watch::channel(false).1,
        Default::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut client = GenerationClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");

    let mut req = tonic::Request::new(v1::Request {
        input: Some(Input::Text("Once upon a time".into())),
        max_tokens: Some(1900),
        ignore_eos: true,
        ..Default::default()
    });
    req.metadata_mut()
        .insert("grpc-timeout", "300m".parse().expect("ascii"));
    let mut stream = client
        .generate_stream(req)
        .await
        .expect("call starts")
        .into_inner();
    let mut tokens = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if let Some(Event::Delta(d)) = m.event {
                    tokens += d.token_ids.len();
                }
                assert!(
                    tokens < 1900,
                    "the stream ran to completion; the deadline was ignored"
                );
            }
            Ok(None) => panic!("the stream ended without an error after {tokens} tokens"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("deadline"), "{status:?}");
    // The sequence is gone from the engine, its blocks freed. The engine
    // thread drops it at its next step; on a loaded machine that step may
    // come late, so wait for the effect (up to a generous bound) rather than
    // for a fixed number of polls.
    let mut s = v1::EngineStats::default();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < until {
        s = client
            .get_stats(GetStatsRequest::default())
            .await
            .expect("stats")
            .into_inner();
        if s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!((s.running, s.waiting, s.kv_blocks_used), (0, 0, 0), "{s:?}");
    let _ = stop_tx.send(());
    server.await.expect("join").expect("server ran");
}
