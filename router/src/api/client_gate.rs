//! The client API's gate (`/v1`), before a body is read: the request's API key (when keys
//! are configured), then that key's token-bucket rate limit (when one is configured; with
//! no keys, one bucket for the whole API). A refusal costs the router a header lookup. A
//! tenant's key puts its tenant (`api::tenants`) and class ceiling on the request.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use ownerserve_edge::api_keys::{self, ApiKeys};
use ownerserve_edge::rate_limit::{RateLimit, RateLimiter};

use crate::api::tenants::{ClassCeiling, Tenant, TenantOf};
use crate::error::ApiError;
use crate::ops::metrics::proxy::ProxyMetrics;

/// The keys and the rate limiter of the client API.
pub struct ClientGate {
    keys: Option<ApiKeys>,
    /// Each key's tenant, by the key's index.
    tenants: Vec<Option<Arc<Tenant>>>,
    rate: Option<RateLimiter>,
    /// Where a refusal for rate is counted (`ownerserve_admission_shed_total`).
    metrics: ProxyMetrics,
}

impl ClientGate {
    /// A gate with `keys` (`None`: open), each key's tenant, and `limit` per key (`None`:
    /// unlimited).
    pub fn new(
        keys: Option<ApiKeys>,
        tenants: Vec<Option<Arc<Tenant>>>,
        limit: Option<RateLimit>,
        metrics: ProxyMetrics,
    ) -> Self {
        let clients = keys.as_ref().map_or(1, ApiKeys::len);
        Self {
            rate: limit.and_then(|l| RateLimiter::new(l, clients)),
            keys,
            tenants,
            metrics,
        }
    }

    /// Whether requests pass through unchecked.
    pub fn is_open(&self) -> bool {
        self.keys.is_none() && self.rate.is_none()
    }
}

/// Middleware: refuses a request without a configured key (401) or over its key's rate
/// (429 with the seconds until its next token).
pub async fn guard(State(gate): State<Arc<ClientGate>>, mut req: Request, next: Next) -> Response {
    let client = match &gate.keys {
        Some(keys) => match keys.which(req.headers()) {
            Some(i) => i,
            None => return api_keys::unauthorized(),
        },
        None => 0,
    };
    if let Some(rate) = &gate.rate {
        if let Err(wait) = rate.take(client, Instant::now().into_std()) {
            gate.metrics.shed("rate_limited");
            return ApiError::RateLimited {
                retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
            }
            .into_response();
        }
    }
    if let Some(Some(tenant)) = gate.tenants.get(client) {
        if let Some(class) = tenant.spec.class {
            req.extensions_mut().insert(ClassCeiling(class));
        }
        req.extensions_mut().insert(TenantOf(tenant.clone()));
    }
    next.run(req).await
}
