//! Tenants (`[router.tenants.<name>]`): what the client gate puts on a request of a
//! tenant's key (the tenant, its class ceiling), and the budgets this router holds for it.
//! They are spent on the request path (`proxy::tenant_budget`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ownerserve_ownership::tenant_budgets::TenantBudget;

use crate::config::TenantSpec;
use crate::ownership::sessions::now_ms;

/// A tenant's budgets as this router holds them.
pub struct Tenant {
    pub spec: TenantSpec,
    /// Tokens taken from the directory's bucket and not yet spent here.
    pub(crate) leased: tokio::sync::Mutex<u64>,
    /// The bucket itself, when there is no directory.
    pub(crate) local: Mutex<TenantBudget>,
    /// Sessions holding a place, as far as this router knows, and until when (ms).
    pub(crate) sessions: Mutex<HashMap<String, u64>>,
}

/// The tenant of a request's API key, set on it by the client gate.
#[derive(Clone)]
pub struct TenantOf(pub Arc<Tenant>);

/// The highest class a request may run in, set on it by the client gate from its API
/// key's tenant.
#[derive(Debug, Clone, Copy)]
pub struct ClassCeiling(pub crate::proxy::admission::Class);

impl Tenant {
    pub fn new(spec: TenantSpec) -> Self {
        let local = TenantBudget {
            tokens: TenantBudget::burst(spec.tokens_per_minute),
            refilled_ms: now_ms(),
            ..TenantBudget::default()
        };
        Self {
            spec,
            leased: tokio::sync::Mutex::new(0),
            local: Mutex::new(local),
            sessions: Mutex::new(HashMap::new()),
        }
    }
}
