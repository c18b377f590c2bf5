//! API keys for the client API (`/v1/...`): when any are configured, a request must present
//! one as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic
//! clients). The key is the client's business with the router alone: it is never passed on
//! to an engine.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;

use crate::auth::{bearer_token, constant_time_eq};
use crate::error_body::{ErrorBody, ErrorCode};

/// The header Anthropic clients send their key in.
pub const X_API_KEY: &str = "x-api-key";

/// The accepted client keys.
#[derive(Clone)]
pub struct ApiKeys(Arc<[String]>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl ApiKeys {
    /// The keys, or `None` when there are none (the client API is open).
    pub fn new(keys: &[String]) -> Option<Self> {
        (!keys.is_empty()).then(|| Self(keys.into()))
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: an empty key list is `None` (see [`ApiKeys::new`]).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The index of the key `headers` present, if it is one of them.
    pub fn which(&self, headers: &axum::http::HeaderMap) -> Option<usize> {
        let presented = bearer_token(headers).or_else(|| {
            headers
                .get(X_API_KEY)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        })?;
        // Every key is compared, so timing does not tell which one nearly matched.
        self.0.iter().enumerate().fold(None, |hit, (i, k)| {
            if constant_time_eq(presented.as_bytes(), k.as_bytes()) {
                Some(i)
            } else {
                hit
            }
        })
    }
}

/// The answer to a request without a configured key (OpenAI's 401 shape).
pub fn unauthorized() -> Response {
    ErrorBody {
        status: StatusCode::UNAUTHORIZED,
        message: "a valid API key is required: `Authorization: Bearer KEY` or `x-api-key: KEY`",
        kind: "authentication_error",
        code: Some(ErrorCode {
            param: None,
            code: "invalid_api_key",
        }),
        extra: Default::default(),
    }
    .response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_taken_from_the_bearer_or_the_x_api_key_header() {
        assert!(ApiKeys::new(&[]).is_none());
        let keys = ApiKeys::new(&["k-one".into(), "k-two".into()]).unwrap();
        let with = |name: &str, v: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
            keys.which(&h)
        };
        assert_eq!(with("authorization", "Bearer k-one"), Some(0));
        assert_eq!(with("authorization", "bearer k-two"), Some(1));
        assert_eq!(with("x-api-key", "k-two"), Some(1));
        assert_eq!(with("authorization", "Bearer k-three"), None);
        assert_eq!(with("x-api-key", "k-on"), None);
        assert_eq!(keys.which(&axum::http::HeaderMap::new()), None);
    }
}
