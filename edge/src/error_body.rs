//! The one place an HTTP error body is built. Every OwnerServe server answers errors in
//! OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, plus any top-level
//! fields a caller needs to act on (a directory follower names its leader), with the
//! status's standard headers: `WWW-Authenticate` on 401, `Retry-After` on 429 and 503.
//! Each server keeps its own table from its errors to status, type, param and code.
//!
//! `param` and `code` come together or not at all ([`ErrorCode`]): the router's clients
//! (OpenAI SDKs) expect both keys, while a directory node's errors have never carried
//! them and its clients read `message` and the extra fields.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

/// An error answer, ready to render as JSON or as a final SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBody<'a> {
    pub status: StatusCode,
    pub message: &'a str,
    /// OpenAI's error `type` (`invalid_request_error`, `server_error`, ...).
    pub kind: &'a str,
    /// The `param` and `code` keys; `None` leaves both out.
    pub code: Option<ErrorCode<'a>>,
    /// Top-level fields beside `error` (empty for most errors).
    pub extra: Map<String, Value>,
}

/// OpenAI's `param` and `code` of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ErrorCode<'a> {
    /// The offending request field, if one is (`null` otherwise).
    pub param: Option<&'a str>,
    /// A machine-readable code.
    pub code: &'a str,
}

#[derive(Serialize)]
struct Wire<'a> {
    error: Detail<'a>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    code: Option<ErrorCode<'a>>,
}

impl ErrorBody<'_> {
    /// The JSON body.
    pub fn json(&self) -> Vec<u8> {
        let wire = Wire {
            error: Detail {
                message: self.message,
                kind: self.kind,
                code: self.code,
            },
            extra: &self.extra,
        };
        // Only strings and JSON values: serializing cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// The error as a stream's last SSE event, then `[DONE]`, for failures after a
    /// stream has started.
    pub fn sse_event(&self) -> Vec<u8> {
        let mut out = b"data: ".to_vec();
        out.extend_from_slice(&self.json());
        out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        out
    }

    /// The HTTP response.
    pub fn response(&self) -> Response {
        let mut resp = (self.status, self.json()).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self.status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Largest plain-text error body rewritten by [`json_error`].
const PLAIN_ERROR_LIMIT: usize = 16 * 1024;

/// An error answer that is not JSON (axum's own rejections of a bad path
/// parameter or body, a 405 from a router) is rewritten in the JSON shape above, with the
/// text as its message, so every error a client sees parses the same way.
/// Run on every answer by [`crate::tracked`].
pub async fn json_error(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), PLAIN_ERROR_LIMIT).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    ErrorBody {
        status,
        message: &message,
        kind: if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        },
        code: None,
        extra: Map::new(),
    }
    .response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(status: StatusCode, extra: Map<String, Value>) -> ErrorBody<'static> {
        ErrorBody {
            status,
            message: "the model `x` does not exist",
            kind: "invalid_request_error",
            code: Some(ErrorCode {
                param: Some("model"),
                code: "model_not_found",
            }),
            extra,
        }
    }

    #[test]
    fn the_body_has_openai_shape_and_extra_fields_sit_beside_it() {
        let mut extra = Map::new();
        extra.insert("leader_addr".into(), Value::from("127.0.0.1:7001"));
        let v: Value = serde_json::from_slice(&body(StatusCode::NOT_FOUND, extra).json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "error": {"message": "the model `x` does not exist", "type": "invalid_request_error",
                          "param": "model", "code": "model_not_found"},
                "leader_addr": "127.0.0.1:7001"
            })
        );
        let sse = body(StatusCode::BAD_GATEWAY, Map::new()).sse_event();
        assert!(sse.starts_with(b"data: {\"error\""));
        assert!(sse.ends_with(b"\n\ndata: [DONE]\n\n"));
    }

    #[test]
    fn without_a_code_neither_param_nor_code_is_sent() {
        let mut extra = Map::new();
        extra.insert("leader_id".into(), Value::from(2));
        let b = ErrorBody {
            status: StatusCode::MISDIRECTED_REQUEST,
            message: "not the leader",
            kind: "directory_error",
            code: None,
            extra,
        };
        assert_eq!(
            String::from_utf8(b.json()).unwrap(),
            r#"{"error":{"message":"not the leader","type":"directory_error"},"leader_id":2}"#
        );
        let openai = ErrorBody {
            code: Some(ErrorCode {
                param: None,
                code: "unavailable",
            }),
            ..b
        };
        assert_eq!(
            String::from_utf8(openai.json()).unwrap(),
            r#"{"error":{"message":"not the leader","type":"directory_error","param":null,"code":"unavailable"},"leader_id":2}"#
        );
    }

    #[test]
    fn statuses_carry_their_standard_headers() {
        let r = body(StatusCode::UNAUTHORIZED, Map::new()).response();
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        for status in [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let r = body(status, Map::new()).response();
            assert_eq!(
                (r.status(), &r.headers()[header::RETRY_AFTER]),
                (status, &HeaderValue::from_static("1"))
            );
        }
        let r = body(StatusCode::NOT_FOUND, Map::new()).response();
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
