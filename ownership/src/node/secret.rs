//! The cluster secret: what lets a peer or a router into a node's Raft RPCs
//! (`/raft/*`) and directory API (`/directory/v1/*`). Every node and router of a cluster
//! holds the same secret and sends it in [`HEADER`]; a request without it, or with another,
//! gets a 401 and touches nothing. (The operator API has its own bearer tokens.)

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use ownerserve_edge::auth::constant_time_eq;

use super::answer::error;

/// The header that carries the cluster secret.
pub const HEADER: &str = "x-ownerserve-cluster-secret";

/// A cluster's shared secret (compared in constant time when checked; `==` is for configs).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Arc<str>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// Why a secret cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the cluster secret must be at least 16 characters")]
    TooShort,
    #[error("the cluster secret must be printable ASCII (it travels in an HTTP header)")]
    NotAHeaderValue,
}

impl ClusterSecret {
    /// Checks that `s` can serve as a secret.
    pub fn new(s: &str) -> Result<Self, SecretError> {
        if s.len() < 16 {
            return Err(SecretError::TooShort);
        }
        HeaderValue::from_str(s).map_err(|_| SecretError::NotAHeaderValue)?;
        Ok(Self(s.into()))
    }

    /// Default headers that present the secret (for a `reqwest` client of the cluster).
    pub fn headers(&self) -> reqwest::header::HeaderMap {
        let mut h = reqwest::header::HeaderMap::new();
        if let Ok(mut v) = reqwest::header::HeaderValue::from_str(&self.0) {
            v.set_sensitive(true);
            h.insert(HEADER, v);
        }
        h
    }

    /// Whether `headers` present this secret (compared without an early exit).
    fn presented_by(&self, headers: &HeaderMap) -> bool {
        headers
            .get(HEADER)
            .is_some_and(|v| constant_time_eq(v.as_bytes(), self.0.as_bytes()))
    }
}

/// A `reqwest` client presenting `secret` (when there is one) on every request.
pub fn client(secret: Option<&ClusterSecret>, timeout: std::time::Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .default_headers(secret.map(ClusterSecret::headers).unwrap_or_default())
        .build()
        .unwrap_or_default()
}

/// Middleware: refuses a request that does not present the cluster secret.
pub async fn require(State(secret): State<ClusterSecret>, req: Request, next: Next) -> Response {
    if secret.presented_by(req.headers()) {
        return next.run(req).await;
    }
    error(
        StatusCode::UNAUTHORIZED,
        format!("this endpoint needs the cluster secret in the `{HEADER}` header"),
        json!({}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_long_enough_and_fits_a_header_and_must_match_exactly() {
        assert!(matches!(
            ClusterSecret::new("short"),
            Err(SecretError::TooShort)
        ));
        assert!(matches!(
            ClusterSecret::new("sixteen chars ok\n"),
            Err(SecretError::NotAHeaderValue)
        ));
        let s = ClusterSecret::new("0123456789abcdef").unwrap();
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(HEADER, v.parse().unwrap());
            s.presented_by(&h)
        };
        assert!(with("0123456789abcdef"));
        assert!(!with("0123456789abcdeF"));
        assert!(!with("0123456789abcdef0"));
        assert!(!s.presented_by(&HeaderMap::new()));
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }
}
