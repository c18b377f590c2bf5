//! A tenant's budgets spent on the request path, once its prompt is counted: tokens a
//! minute taken from the directory's bucket for the tenant
//! (`ownerserve_ownership::tenant_budgets`) in chunks of a hundredth of a minute's worth
//! and spent here, and a session's place among the tenant's live sessions, held in the
//! directory until it is idle for `session_idle_s` (renewed past half of that). Over any
//! minute the fleet admits at most the tenant's rate, plus a twentieth (the bucket), plus
//! one chunk per router, plus one request. Without a directory each router keeps the
//! budgets alone (a limit per replica, as the other routers have). When the directory does
//! not answer within `ownership_claim_timeout_ms` the request goes on, counted
//! (`budget_unavailable`): a budget is not worth an outage.

use ownerserve_ownership::command::Command;
use ownerserve_ownership::ids::SessionId;
use ownerserve_ownership::outcome::Outcome;
use ownerserve_shim::openai::ParsedRequest;

use crate::api::tenants::Tenant;
use crate::error::ApiError;
use crate::ownership::sessions::now_ms;
use crate::proxy::identity::Identity;
use crate::server::state::AppState;

/// Completion tokens charged for a request that sets no `max_tokens`.
pub const UNSET_MAX_TOKENS_CHARGE: u64 = 1_024;

/// The tokens a request is charged: its prompt's, and `max_tokens` for each choice.
pub fn charge_of(parsed: &ParsedRequest<'_>, id: &Identity<'_>) -> u64 {
    let completion = parsed
        .sampling
        .max_tokens
        .map_or(UNSET_MAX_TOKENS_CHARGE, u64::from);
    u64::from(id.prompt_tokens()).saturating_add(completion.saturating_mul(parsed.choices()))
}

/// Admits a request of `tenant` against its budgets, or refuses it with a 429.
pub(crate) async fn admit(
    st: &AppState,
    tenant: &Tenant,
    parsed: &ParsedRequest<'_>,
    id: &Identity<'_>,
) -> Result<(), ApiError> {
    let name = tenant.spec.name.as_str();
    let counted = |outcome| st.metrics.admission.tenant(name, outcome);
    let charge = charge_of(parsed, id);
    let answer = async {
        spend(st, tenant, charge).await?;
        match id.tracked() {
            // A session the client closes with this step gives its place back at once.
            Some(session) if closes(id) => {
                release(st, tenant, session).await;
                Ok(Held::Yes)
            }
            Some(session) => hold(st, tenant, session).await,
            None => Ok(Held::Yes),
        }
    };
    let held = answer.await;
    if held.is_ok() {
        st.metrics.admission.tenant_tokens(name, charge);
    }
    match held {
        Ok(Held::Yes) => counted("admitted"),
        Ok(Held::Unknown) => counted("budget_unavailable"),
        Err(e) => {
            counted(match e {
                ApiError::TooManySessions { .. } => "over_sessions",
                _ => "over_tokens",
            });
            return Err(e);
        }
    }
    Ok(())
}

/// Whether the budgets were checked.
enum Held {
    Yes,
    /// The directory did not answer: let through.
    Unknown,
}

/// Spends `tokens` of the tenant's minute.
async fn spend(st: &AppState, tenant: &Tenant, tokens: u64) -> Result<Held, ApiError> {
    let per_minute = tenant.spec.tokens_per_minute;
    if per_minute == 0 {
        return Ok(Held::Yes);
    }
    let Some(sync) = &st.ownership else {
        let mut b = tenant.local.lock().unwrap_or_else(|e| e.into_inner());
        b.refill(per_minute, now_ms());
        if b.tokens <= 0 {
            return Err(rate_limited(b.wait_ms(per_minute)));
        }
        b.tokens = b
            .tokens
            .saturating_sub(i64::try_from(tokens).unwrap_or(i64::MAX));
        return Ok(Held::Yes);
    };
    // One chunk at a time per tenant: requests arriving meanwhile wait for it.
    let mut leased = tenant.leased.lock().await;
    if *leased >= tokens {
        *leased -= tokens;
        return Ok(Held::Yes);
    }
    let want = (tokens - *leased).max(per_minute / 100).max(1);
    let command = Command::SpendTokens {
        tenant: tenant.spec.name.clone(),
        tokens: want,
        per_minute,
    };
    let answer =
        tokio::time::timeout(st.cfg.ownership_claim_timeout, sync.client().write(command)).await;
    match answer {
        Ok(Ok(Outcome::TokensGranted { tokens: granted })) => {
            *leased = (*leased + granted).saturating_sub(tokens);
            Ok(Held::Yes)
        }
        Ok(Ok(Outcome::TokensRefused { wait_ms })) => Err(rate_limited(wait_ms)),
        other => {
            tracing::warn!(
                tenant = tenant.spec.name,
                ?other,
                "tenant budget unavailable"
            );
            Ok(Held::Unknown)
        }
    }
}

/// Holds `session`'s place among the tenant's live sessions.
async fn hold(st: &AppState, tenant: &Tenant, session: &str) -> Result<Held, ApiError> {
    let (max, ttl) = (tenant.spec.max_sessions, tenant.spec.session_idle_ms);
    if max == 0 {
        return Ok(Held::Yes);
    }
    let now = now_ms();
    if let Some(decided) = hold_here(tenant, session, now, st.ownership.is_none()) {
        return decided;
    }
    let Some(sync) = &st.ownership else {
        return Ok(Held::Yes);
    };
    let command = Command::HoldTenantSession {
        tenant: tenant.spec.name.clone(),
        session: SessionId(session.to_owned()),
        max,
        ttl_ms: ttl,
    };
    let answer =
        tokio::time::timeout(st.cfg.ownership_claim_timeout, sync.client().write(command)).await;
    match answer {
        Ok(Ok(Outcome::SessionHeld { .. })) => {
            let mut held = tenant.sessions.lock().unwrap_or_else(|e| e.into_inner());
            // What this router remembers is bounded by the tenant's limit.
            if held.len() >= 2 * max as usize + 64 {
                held.retain(|_, until| *until > now);
            }
            held.insert(session.to_owned(), now + ttl);
            Ok(Held::Yes)
        }
        Ok(Ok(Outcome::SessionRefused { .. })) => Err(ApiError::TooManySessions {
            tenant: tenant.spec.name.clone(),
            max,
        }),
        other => {
            tracing::warn!(
                tenant = tenant.spec.name,
                ?other,
                "tenant sessions unavailable"
            );
            Ok(Held::Unknown)
        }
    }
}

/// Whether the client ends its session with this step (`x-ownerserve-session-control:
/// close`, Dynamo's `nvext.session_control` `close`).
fn closes(id: &Identity<'_>) -> bool {
    matches!(
        id.control,
        Some((ownerserve_shim::openai::SessionAction::Close, _))
    )
}

/// Gives `session`'s place among the tenant's live sessions back (here, and in the
/// directory when there is one; a directory that does not answer keeps it until it is
/// idle for `session_idle_s`).
async fn release(st: &AppState, tenant: &Tenant, session: &str) {
    if tenant.spec.max_sessions == 0 {
        return;
    }
    tenant
        .sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(session);
    if let Some(sync) = &st.ownership {
        let command = Command::ReleaseTenantSession {
            tenant: tenant.spec.name.clone(),
            session: SessionId(session.to_owned()),
        };
        let _ = tokio::time::timeout(st.cfg.ownership_claim_timeout, sync.client().write(command))
            .await;
    }
}

/// What this router can decide of a session's place alone: it holds one renewed within
/// half its TTL, or, with no directory (`alone`), the router's own count decides. `None`:
/// ask the directory.
fn hold_here(
    tenant: &Tenant,
    session: &str,
    now: u64,
    alone: bool,
) -> Option<Result<Held, ApiError>> {
    let (max, ttl) = (tenant.spec.max_sessions, tenant.spec.session_idle_ms);
    let mut held = tenant.sessions.lock().unwrap_or_else(|e| e.into_inner());
    if held.get(session).is_some_and(|u| *u > now + ttl / 2) {
        return Some(Ok(Held::Yes));
    }
    if !alone {
        return None;
    }
    held.retain(|_, until| *until > now);
    if held.len() >= max as usize && !held.contains_key(session) {
        return Some(Err(ApiError::TooManySessions {
            tenant: tenant.spec.name.clone(),
            max,
        }));
    }
    held.insert(session.to_owned(), now + ttl);
    Some(Ok(Held::Yes))
}

fn rate_limited(wait_ms: u64) -> ApiError {
    ApiError::RateLimited {
        retry_after_s: wait_ms.div_ceil(1_000).max(1),
    }
}
