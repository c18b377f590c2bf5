//! The front half of a request, one function for every caller that plans from a client's
//! body (the proxy, `explain`, the endpoint picker, `count_tokens`): read the body within
//! its limit, parse and validate it (ingress), take an admission slot when the caller
//! serves the request, then the step's identity and prompt ([`step_identity`]: ingress
//! refuses a prompt over the model's context before the identity is made), and, when the
//! caller serves it, a new session's wait for room in the fleet's KV
//! ([`super::session_admission`]). What the caller does next borrows all of it, so it runs
//! as `then`.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue};

use ownerserve_shim::openai::{Endpoint, ParsedRequest};

use super::identity::{self, Identity};
use super::{admit, ingress};
use crate::api::tenants::{ClassCeiling, TenantOf};
use crate::error::ApiError;
use crate::prompt::{Hashing, PromptHasher};
use crate::proxy::admission::class::{self, Class};
use crate::proxy::admission::{Asked, Ticket};
use crate::server::state::AppState;

/// What a caller asks of the front half.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub endpoint: Endpoint,
    /// What the prompt stage computes and keeps.
    pub hashing: Hashing,
    /// Take a slot for the model before any tokenizing (an overloaded router sheds at the
    /// cost of a parse); a dry run (explain, count_tokens) takes none.
    pub admits: bool,
}

/// The request as the front half leaves it.
pub(crate) struct Front<'a> {
    pub req: &'a ingress::Admitted,
    pub parsed: &'a ParsedRequest<'a>,
    pub id: &'a Identity<'a>,
    /// The model's admission slot, when the caller asked for one.
    pub ticket: Option<Ticket>,
    /// The request's admission class (and so its engine priority).
    pub class: Class,
}

/// Runs the front half of `req`, then `then` on what it computed.
pub(crate) async fn front_half<T>(
    st: &AppState,
    req: Request,
    ask: Ask,
    then: impl for<'a> AsyncFnOnce(Front<'a>) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let req = ingress::Admitted::read(req, &st.body_limits).await?;
    let parsed = req.parse(ask.endpoint, &st.registry, st.cfg.request_limits)?;
    let asked = Asked {
        class: class::resolve(
            class::asked(&req.parts.headers, &parsed)?,
            req.parts.extensions.get::<ClassCeiling>().map(|c| c.0),
            st.admission.default_class(),
        ),
        returning: super::session_admission::has_answer(&parsed),
    };
    let mut ticket = match ask.admits {
        true => Some(admit(st, &parsed.model, asked).await?),
        false => None,
    };
    let id = step_identity(
        &st.prompts,
        &req.parts.headers,
        &parsed,
        &req.request_id,
        ask.hashing,
    )
    .await?;
    if ask.admits {
        if let Some(TenantOf(tenant)) = req.parts.extensions.get::<TenantOf>() {
            super::tenant_budget::admit(st, tenant, &parsed, &id).await?;
        }
        // A held first step gives its slot back while it waits, then takes one again.
        super::session_admission::wait_for_room(st, &parsed, &id, &mut ticket).await;
        if ticket.is_none() {
            ticket = Some(admit(st, &parsed.model, asked).await?);
        }
    }
    then(Front {
        req: &req,
        parsed: &parsed,
        id: &id,
        ticket,
        class: asked.class,
    })
    .await
}

/// Sessions → prompt → context check → identity: the agent ids name the prompt's key, the
/// prompt service tokenizes and hashes, ingress refuses a prompt over the model's context,
/// and only then is the step's identity made.
pub(crate) async fn step_identity<'a>(
    prompts: &PromptHasher,
    headers: &'a HeaderMap,
    parsed: &'a ParsedRequest<'_>,
    request_id: &HeaderValue,
    hashing: Hashing,
) -> Result<Identity<'a>, ApiError> {
    let ids = identity::agent_ids(headers, parsed);
    let prompted = prompts.prompt(parsed, ids.kept_as(), hashing).await?;
    ingress::check_context(parsed, &prompted)?;
    Ok(identity::identify(
        ids,
        headers,
        parsed,
        request_id,
        prompted.hashed,
        prompted.exact,
    ))
}
