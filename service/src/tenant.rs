//! Who a request is for. The auth layer resolves a request's API key to a
//! [`Tenant`] and puts it in the request's extensions (`tonic::Request::
//! extensions`), where every later stage (quotas, the scheduler's fair
//! sharing, metrics, logs and traces) reads it. Without keys every request is
//! [`Tenant::anonymous`].

use std::sync::Arc;

/// A tenant as the rest of the server sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant's name from the keys file (`anonymous` without keys).
    pub name: Arc<str>,
    /// Scheduling priority: higher runs first, as the request's own
    /// `priority` does; the two are added.
    pub priority: i32,
    /// Share of the engine under contention, relative to other tenants'
    /// (weighted fair queuing); at least 1.
    pub weight: u32,
}

impl Tenant {
    /// The tenant of every request when no keys are configured.
    pub fn anonymous() -> Self {
        Self {
            name: Arc::from("anonymous"),
            priority: 0,
            weight: 1,
        }
    }

    /// The request's tenant, or [`Tenant::anonymous`] when no layer set one.
    pub fn of<T>(req: &tonic::Request<T>) -> Self {
        req.extensions()
            .get::<Tenant>()
            .cloned()
            .unwrap_or_else(Self::anonymous)
    }
}
