//! Errors in Anthropic's shape for the Messages API (`/v1/messages…`): Claude Code and the
//! `anthropic` SDKs read `{"type": "error", "error": {"type", "message"}}`, with Anthropic's
//! error types by status (`invalid_request_error` 400, `authentication_error` 401,
//! `permission_error` 403, `not_found_error` 404, `request_too_large` 413,
//! `rate_limit_error` 429, `overloaded_error` 503/529, `api_error` otherwise). Every
//! error there is built in OpenAI's shape first ([`crate::error_body`]); this middleware
//! rewrites it, keeping the status and headers (`Retry-After`, `WWW-Authenticate`).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

/// Largest error body rewritten (errors are small; a larger body passes as it is).
const ERROR_LIMIT: usize = 64 * 1024;

/// Anthropic's error type for `status`.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if (400..500).contains(&s) => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error body for `status` and `message`.
pub fn body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// Middleware: a JSON error answer to a `/v1/messages…` request, rewritten in Anthropic's
/// shape; every other answer passes untouched.
pub async fn rewrite(req: Request, next: Next) -> Response {
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !anthropic || !is_json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, old) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(old, ERROR_LIMIT).await else {
        let message = status.canonical_reason().unwrap_or("error");
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(body(status, message).to_string()));
    };
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if v["type"] == "error" {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let message = v["error"]["message"]
        .as_str()
        .or_else(|| v["message"].as_str())
        .or_else(|| v["detail"].as_str())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body(status, message).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropics_error_types() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (503, "overloaded_error"),
            (502, "api_error"),
        ];
        for (s, t) in cases {
            let status = StatusCode::from_u16(s).unwrap();
            assert_eq!(error_type(status), t);
            assert_eq!(body(status, "m")["error"]["type"], t);
        }
    }
}
