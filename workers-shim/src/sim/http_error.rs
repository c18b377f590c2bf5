//! The simulated worker's error responses, in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`) as vLLM's server sends them, built
//! in one place.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::engine::EngineClosed;
use super::fence::{ClaimError, StaleEpoch};

#[derive(Serialize)]
pub(super) struct ErrorBody<'a> {
    pub(super) error: ErrorDetail<'a>,
}

#[derive(Serialize)]
pub(super) struct ErrorDetail<'a> {
    pub(super) message: &'a str,
    #[serde(rename = "type")]
    pub(super) kind: &'a str,
    pub(super) param: Option<&'a str>,
    pub(super) code: Option<&'a str>,
}

/// A JSON error response.
pub(super) fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            message,
            kind,
            param,
            code,
        },
    };
    json_response(status, &body)
}

/// A JSON response.
pub(super) fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Why a KV or fenced request failed, classified for its status code.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApiError {
    /// The body or a header is malformed (400).
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<&'static str>,
    },
    /// The session has moved to a newer epoch (409, code `stale_epoch`).
    #[error(transparent)]
    StaleEpoch(#[from] StaleEpoch),
    /// A peer engine failed or refused (502).
    #[error("{0}")]
    BadGateway(String),
    /// The engine is shutting down (503).
    #[error(transparent)]
    Closed(#[from] EngineClosed),
}

impl ApiError {
    /// A malformed body or field.
    pub(super) fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param,
        }
    }
}

impl From<ClaimError> for ApiError {
    fn from(e: ClaimError) -> Self {
        Self::bad_request(e.to_string(), None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            Self::BadRequest { param, .. } => error_response(
                StatusCode::BAD_REQUEST,
                &message,
                "BadRequestError",
                param,
                Some("invalid_value"),
            ),
            Self::StaleEpoch(_) => error_response(
                StatusCode::CONFLICT,
                &message,
                "invalid_request_error",
                None,
                Some("stale_epoch"),
            ),
            Self::BadGateway(_) => error_response(
                StatusCode::BAD_GATEWAY,
                &message,
                "BadGatewayError",
                None,
                None,
            ),
            Self::Closed(_) => error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &message,
                "ServiceUnavailableError",
                None,
                None,
            ),
        }
    }
}
