//! What a client asks of its session's life, from the request: a close or a keep-alive
//! (`x-ownerserve-session-control`, or Dynamo's `nvext.session_control`). Carried out by
//! the session tracker (`crate::ownership::sessions`).

use axum::http::HeaderMap;

use ownerserve_shim::openai::{ParsedRequest, SessionAction, SESSION_TIMEOUT_S};

use crate::api::headers;

/// What the client asks of its session's life: the `x-ownerserve-session-control` header
/// (`close`, `keep-alive`/`bind`/`open`, optionally `; timeout=<s>`), else Dynamo's
/// `nvext.session_control` in the body. An unknown header value asks nothing.
pub(super) fn session_control(
    headers: &HeaderMap,
    parsed: &ParsedRequest<'_>,
) -> Option<(SessionAction, u64)> {
    if let Some(v) = headers
        .get(headers::SESSION_CONTROL)
        .and_then(|v| v.to_str().ok())
    {
        let mut parts = v.split(';').map(str::trim);
        let action = SessionAction::parse(&parts.next()?.to_ascii_lowercase())?;
        let timeout = parts
            .find_map(|p| p.strip_prefix("timeout="))
            .and_then(|t| t.parse().ok())
            .unwrap_or(SESSION_TIMEOUT_S);
        return Some((action, timeout));
    }
    parsed
        .session_control
        .as_ref()
        .map(|c| (c.action, c.timeout_s))
}
