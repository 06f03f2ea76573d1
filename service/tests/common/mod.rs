//! What the tests share: serving the gRPC routes on a listener as the `gyre`
//! binary does (the routes from `gyre_service::server`, the connections
//! through `gyre_shim::conn`).

use std::future::Future;
use std::sync::Arc;

use gyre_service::runtime::ModelRuntime;
use gyre_shim::conn::ConnLimits;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `models` on `listener` until `shutdown` resolves.
#[allow(dead_code)]
pub async fn serve_grpc(
    listener: TcpListener,
    models: Vec<Arc<ModelRuntime>>,
    api_key: Option<String>,
    draining: watch::Receiver<bool>,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let routes = gyre_service::server::grpc_service(models, api_key, draining).await?;
    gyre_shim::conn::serve(listener, routes, limits, shutdown).await;
    Ok(())
}

/// Serves `models` on `listener` with its Responses store in `store`
/// until `shutdown` resolves.
#[allow(dead_code)]
pub async fn serve_grpc_with_store(
    listener: TcpListener,
    models: Vec<Arc<ModelRuntime>>,
    store: Arc<gyre_service::responses::Store>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let draining = watch::channel(false).1;
    let routes =
        gyre_service::server::grpc_service_with_store(models, None, draining, store).await?;
    gyre_shim::conn::serve(listener, routes, Default::default(), shutdown).await;
    Ok(())
}
