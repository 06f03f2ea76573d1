//! Tenants share the engine through the service: a tenant flooding the
//! queue cannot starve another's requests. A layer installed here (standing
//! in for the auth layer) sets each call's tenant from its `x-test-tenant`
//! metadata; the service passes it to the engine, whose scheduler admits by
//! weighted fair queuing. Admissions are counted one at a time: the test
//! frees one of the engine's two running slots (by cancelling the oldest
//! running stream) and sees whose stream starts next. A refusal of a full
//! queue carries the request's queue position (`x-queue-position`).

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{self, GenerateResponse, request::Input};
use gyre_engine::{DeviceChoice, Engine, EngineOptions};
use gyre_service::runtime::ModelRuntime;
use gyre_service::tenant::Tenant;
use tokio::net::TcpListener;
use tonic::Streaming;
use tonic::transport::Channel;

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-llama")
}

/// Sets the tenant of each call from its `x-test-tenant` metadata, as the
/// auth layer does from the caller's key.
#[derive(Clone)]
struct SetTenant<S>(S);

impl<S, B> tower::Service<http::Request<B>> for SetTenant<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> S::Future {
        let name = req
            .headers()
            .get("x-test-tenant")
            .and_then(|v| v.to_str().ok())
            .map(Arc::<str>::from);
        if let Some(name) = name {
            req.extensions_mut().insert(Tenant {
                name,
                priority: 0,
                weight: 1,
            });
        }
        self.0.call(req)
    }
}

/// A server over tiny-llama with these limits; its address and engine.
async fn serve(max_running: usize, max_queue: usize) -> (String, Engine) {
    let mut opts = EngineOptions::new(model_dir());
    opts.device = DeviceChoice::Cpu;
    opts.max_running = max_running;
    opts.queue_capacity = max_queue;
    let rt =
        tokio::task::spawn_blocking(move || ModelRuntime::load(opts, None, Default::default()))
            .await
            .expect("join")
            .expect("model loads (build fixtures with `make models`)");
    let engine = rt.engine.clone();
    let draining = tokio::sync::watch::channel(false).1;
    let routes = gyre_service::server::grpc_service(vec![Arc::new(rt)], None, draining)
        .await
        .expect("routes");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(gyre_shim::conn::serve(
        listener,
        SetTenant(routes),
        Default::default(),
        std::future::pending(),
    ));
    (format!("http://{addr}"), engine)
}

/// Starts a generation far longer than the test looks at it.
async fn long_call(
    client: &mut GenerationClient<Channel>,
    tenant: &str,
    i: usize,
) -> Result<Streaming<GenerateResponse>, tonic::Status> {
    let mut req = tonic::Request::new(v1::Request {
        input: Some(Input::Text(format!("Story {i} of {tenant}:"))),
        max_tokens: Some(2000),
        ignore_eos: true,
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-test-tenant", tenant.parse().expect("ascii"));
    client.generate_stream(req).await.map(|r| r.into_inner())
}

type Who = (&'static str, usize);
type Started = Pin<Box<dyn Future<Output = (Who, Streaming<GenerateResponse>)> + Send>>;

/// Resolves when the stream's first event arrives: the engine started it.
fn started(who: Who, mut s: Streaming<GenerateResponse>) -> Started {
    Box::pin(async move {
        match s.message().await {
            Ok(Some(_)) => (who, s),
            other => panic!("{who:?} ended before its first event: {other:?}"),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_the_queue_does_not_starve_another() {
    let (addr, engine) = serve(2, 64).await;
    let mut client = GenerationClient::connect(addr).await.expect("connect");
    let mut pending = FuturesUnordered::new();
    // "heavy" sends ten times the requests of "light", first.
    for i in 0..20 {
        let s = long_call(&mut client, "heavy", i).await.expect("accepted");
        pending.push(started(("heavy", i), s));
    }
    engine
        .wait_stats(|s| s.running == 2 && s.waiting == 18)
        .await;
    let mut running = VecDeque::new();
    for _ in 0..2 {
        running.push_back(pending.next().await.expect("a heavy request starts"));
    }
    for i in 0..2 {
        let s = long_call(&mut client, "light", i).await.expect("accepted");
        pending.push(started(("light", i), s));
    }
    engine.wait_stats(|s| s.waiting == 20).await;

    // Free one slot at a time; the engine admits one request into it.
    let mut order = Vec::new();
    while order.iter().filter(|t| **t == "light").count() < 2 {
        assert!(order.len() < 8, "light still waits after {order:?}");
        drop(running.pop_front());
        let ((tenant, i), s) = pending.next().await.expect("a request starts");
        order.push(tenant);
        running.push_back(((tenant, i), s));
    }
    // Equal weights: "light" gets every other free slot while it waits (at
    // most one of "heavy"'s 18 waiting requests before each of its own);
    // first come, first served would start all 18 first.
    assert!(
        order.len() <= 4,
        "admission order after light arrived: {order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_a_full_queue_tells_the_queue_position() {
    let (addr, engine) = serve(1, 1).await;
    let mut client = GenerationClient::connect(addr).await.expect("connect");
    let _running = long_call(&mut client, "a", 0).await.expect("accepted");
    let _waiting = long_call(&mut client, "a", 1).await.expect("accepted");
    engine
        .wait_stats(|s| s.running == 1 && s.waiting == 1)
        .await;
    let refused = long_call(&mut client, "b", 2)
        .await
        .expect_err("the queue is full");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // One request waits: this one would have been second in line.
    let position = refused
        .metadata()
        .get("x-queue-position")
        .and_then(|v| v.to_str().ok());
    assert_eq!(position, Some("2"), "{:?}", refused.metadata());
}
