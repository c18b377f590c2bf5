//! The single mapping from router errors to HTTP: each error's status, OpenAI error type,
//! offending parameter and code. Handlers return `Result<_, ApiError>`; the body itself
//! is built by `ownerserve_edge::error_body`, the one builder every server uses.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use ownerserve_edge::error_body::{ErrorBody, ErrorCode};

use crate::api::SseError;
use ownerserve_shim::openai::{Endpoint, RequestError};

/// Everything that can go wrong serving a client request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("failed to read the request body: {0}")]
    BodyRead(String),
    #[error("the request body did not arrive within {after:?}")]
    BodyTimeout { after: Duration },
    #[error("the request body arrived slower than {min_bytes_per_s} bytes/s")]
    BodySlow { min_bytes_per_s: u64 },
    #[error("the router is overloaded: {why}; retry shortly")]
    RouterBusy { why: &'static str },
    #[error("the router is overloaded: tokenizing the prompt did not finish within {after:?}; retry shortly")]
    TokenizeTimeout { after: Duration },
    #[error("rate limit exceeded for this API key; retry in {retry_after_s} s")]
    RateLimited { retry_after_s: u64 },
    #[error(
        "tenant `{tenant}` already has its {max} live sessions; end one or wait until one is idle"
    )]
    TooManySessions { tenant: String, max: u32 },
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    #[error("no healthy worker serves model `{model}` right now")]
    NoHealthyWorker { model: String },
    #[error("every worker serving model `{model}` is busy; retry shortly")]
    AllBusy { model: String },
    #[error("model `{model}` is overloaded: {why}; retry in {retry_after_s} s")]
    Overloaded {
        model: String,
        why: &'static str,
        retry_after_s: u64,
    },
    #[error("model `{model}` is overloaded: no slot freed within the {class} class's queue deadline; retry in {retry_after_s} s")]
    QueueTimeout {
        model: String,
        class: &'static str,
        retry_after_s: u64,
    },
    #[error("worker {worker} is unreachable")]
    UpstreamUnreachable { worker: String },
    #[error("worker {worker} did not answer within {after:?}")]
    UpstreamTimeout { worker: String, after: Duration },
    #[error("response '{id}' was stored by worker {worker}, which is gone; its conversation is lost: start again without previous_response_id")]
    ResponseLost { id: String, worker: String },
    #[error("response '{id}' is stored by worker {worker}, which is not answering; retry shortly (if it does not come back within its lease, the response is lost)")]
    ResponseOwnerDown { id: String, worker: String },
    #[error("response '{0}' not found")]
    ResponseNotFound(String),
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("no worker is named `{0}`")]
    UnknownWorker(String),
    #[error("worker `{0}` has no KV event stream applied since this router's index last forgot it: nothing to copy")]
    NoKvCopy(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// A bug or a shutdown cut the request short inside the router.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// HTTP status, OpenAI error type, offending parameter and code.
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per error, in declaration order"
    )]
    fn parts(&self) -> (StatusCode, &'static str, Option<&str>, &'static str) {
        use ApiError::*;
        match self {
            BadRequest(e) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e.param.as_deref(),
                e.code,
            ),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                "request_too_large",
            ),
            BodyRead(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                "invalid_body",
            ),
            BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                None,
                "body_timeout",
            ),
            BodySlow { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                None,
                "body_timeout",
            ),
            RouterBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                "overloaded",
            ),
            TokenizeTimeout { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                "tokenize_timeout",
            ),
            RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                "rate_limit_exceeded",
            ),
            TooManySessions { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                "too_many_sessions",
            ),
            ModelNotFound(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                "model_not_found",
            ),
            NoHealthyWorker { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                "no_healthy_worker",
            ),
            AllBusy { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                "all_workers_busy",
            ),
            Overloaded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                "overloaded",
            ),
            QueueTimeout { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                "queue_timeout",
            ),
            UpstreamUnreachable { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                None,
                "upstream_unreachable",
            ),
            UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                None,
                "upstream_timeout",
            ),
            ResponseLost { .. } => (
                StatusCode::GONE,
                "invalid_request_error",
                Some("previous_response_id"),
                "response_lost",
            ),
            ResponseOwnerDown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("previous_response_id"),
                "response_owner_unavailable",
            ),
            ResponseNotFound(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("response_id"),
                "response_not_found",
            ),
            NotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                "unknown_url",
            ),
            UnknownWorker(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                "unknown_worker",
            ),
            NoKvCopy(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                "no_kv_copy",
            ),
            MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                None,
                "method_not_allowed",
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                "internal_error",
            ),
        }
    }

    /// The error as a stream's last SSE event, for failures after a stream has started.
    pub fn sse_event(&self) -> Vec<u8> {
        self.with_body(|b| b.sse_event())
    }

    /// The error as the last event of a stream of `endpoint`, as its row of
    /// `api::ENDPOINTS` says: Anthropic's `error` event on Messages, the Responses `error`
    /// event on Responses (neither API has `[DONE]`), else [`Self::sse_event`].
    pub fn sse_event_for(&self, endpoint: Endpoint) -> Vec<u8> {
        let message = self.to_string();
        let (status, _, _, code) = self.parts();
        let event = match crate::api::endpoints::of(endpoint).sse_error {
            Some(SseError::Anthropic) => ownerserve_edge::anthropic_errors::body(status, &message),
            Some(SseError::Responses) => serde_json::json!({
                "type": "error", "code": code, "message": message, "param": null,
            }),
            Some(SseError::OpenAiDone) | None => return self.sse_event(),
        };
        format!("event: error\ndata: {event}\n\n").into_bytes()
    }

    fn with_body<T>(&self, f: impl FnOnce(&ErrorBody<'_>) -> T) -> T {
        let message = self.to_string();
        let (status, kind, param, code) = self.parts();
        f(&ErrorBody {
            status,
            message: &message,
            kind,
            code: Some(ErrorCode { param, code }),
            extra: Default::default(),
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = self.with_body(|b| b.response());
        // Every 429 and 503 says `Retry-After: 1`; these know better.
        if let ApiError::Overloaded { retry_after_s, .. }
        | ApiError::QueueTimeout { retry_after_s, .. }
        | ApiError::RateLimited { retry_after_s } = self
        {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, retry_after_s.into());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use axum::http::header;

    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::ModelNotFound("gpt-x".into());
        let v: serde_json::Value = serde_json::from_slice(&e.with_body(|b| b.json())).unwrap();
        assert_eq!(v["error"]["message"], "the model `gpt-x` does not exist");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(e.into_response().status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_failed_stream_ends_with_its_apis_own_error_event() {
        let e = ApiError::UpstreamUnreachable { worker: "w".into() };
        let text = |endpoint| String::from_utf8(e.sse_event_for(endpoint)).unwrap();
        let anthropic = text(Endpoint::Messages);
        assert!(
            anthropic.starts_with("event: error\ndata: {"),
            "{anthropic}"
        );
        let data: serde_json::Value = serde_json::from_str(
            anthropic
                .lines()
                .nth(1)
                .unwrap()
                .trim_start_matches("data: "),
        )
        .unwrap();
        assert_eq!(data["type"], "error");
        assert_eq!(data["error"]["type"], "api_error");
        assert!(text(Endpoint::Responses).contains(r#""code":"upstream_unreachable""#));
        assert!(text(Endpoint::ChatCompletions).ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn unavailable_and_busy_say_when_to_retry() {
        let r = ApiError::NoHealthyWorker { model: "m".into() }.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::AllBusy { model: "m".into() }.into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
