//! Bearer-token auth for the operator API (`/admin/v1/...`): a read token may GET, an admin
//! token may do anything. Tokens come from config, flags or `OWNERSERVE_ADMIN_TOKEN` /
//! `OWNERSERVE_READ_TOKEN`; when no admin token is configured one is generated and printed,
//! so the admin API is never open.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error_body::{ErrorBody, ErrorCode};

/// A request to the operator API without the scope it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("this token may only read")]
    Forbidden,
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, kind, code) = match self {
            AuthError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_token",
            ),
            AuthError::Forbidden => (
                StatusCode::FORBIDDEN,
                "permission_error",
                "insufficient_scope",
            ),
        };
        ErrorBody {
            status,
            message: &message,
            kind,
            code: Some(ErrorCode { param: None, code }),
            extra: Default::default(),
        }
        .response()
    }
}

/// The accepted tokens.
#[derive(Debug, Clone)]
pub struct Tokens {
    admin: String,
    read: Option<String>,
}

/// Where the admin token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Configured,
    Generated,
}

impl Tokens {
    /// Tokens from config; generates the admin token if none is set.
    pub fn resolve(admin: Option<String>, read: Option<String>) -> std::io::Result<(Self, Origin)> {
        let read = read.filter(|t| !t.is_empty());
        match admin.filter(|t| !t.is_empty()) {
            Some(admin) => Ok((Self { admin, read }, Origin::Configured)),
            None => Ok((
                Self {
                    admin: random_token()?,
                    read,
                },
                Origin::Generated,
            )),
        }
    }

    /// The admin token (to print when generated).
    pub fn admin(&self) -> &str {
        &self.admin
    }

    fn check(&self, presented: Option<&str>, write: bool) -> Result<(), AuthError> {
        let Some(token) = presented else {
            return Err(AuthError::Unauthorized);
        };
        if constant_time_eq(token, &self.admin) {
            return Ok(());
        }
        if self
            .read
            .as_deref()
            .is_some_and(|r| constant_time_eq(token, r))
        {
            return if write {
                Err(AuthError::Forbidden)
            } else {
                Ok(())
            };
        }
        Err(AuthError::Unauthorized)
    }
}

/// 128 random bits from the OS, hex-encoded (tokens and secrets).
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares without an early exit, so timing does not reveal how much of a token matched.
pub fn constant_time_eq(a: impl AsRef<[u8]>, b: impl AsRef<[u8]>) -> bool {
    let (a, b) = (a.as_ref(), b.as_ref());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is
/// case-insensitive (RFC 9110 §11.1), so `bearer` and `BEARER` work too.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Paths that only read though they are POSTed (a dry run): the read scope may call them.
const READ_ONLY_POSTS: &[&str] = &["/admin/v1/plan/explain"];

/// Paths that are read but hand over everything at once (a backup of the directory): the
/// admin scope only.
const ADMIN_ONLY_GETS: &[&str] = &["/admin/v1/snapshot"];

/// Middleware: GET and HEAD (and the read-only POSTs) need the read scope, everything
/// else (and the admin-only GETs) the admin scope.
pub async fn require(State(tokens): State<Arc<Tokens>>, req: Request, next: Next) -> Response {
    let presented = bearer_token(req.headers());
    let path = req.uri().path();
    let write = (!matches!(*req.method(), Method::GET | Method::HEAD)
        && !READ_ONLY_POSTS.contains(&path))
        || ADMIN_ONLY_GETS.contains(&path);
    match tokens.check(presented, write) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let with = |v: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer_token(&h).map(str::to_owned)
        };
        assert_eq!(with("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(with("bearer abc").as_deref(), Some("abc"));
        assert_eq!(with("BEARER  abc ").as_deref(), Some("abc"));
        assert_eq!(with("Basic abc"), None);
        assert_eq!(with("Bearerabc"), None);
    }

    #[test]
    fn scopes_are_enforced() {
        let (t, origin) = Tokens::resolve(Some("adm".into()), Some("rd".into())).unwrap();
        assert_eq!(origin, Origin::Configured);
        assert!(t.check(Some("adm"), true).is_ok());
        assert!(t.check(Some("rd"), false).is_ok());
        assert!(matches!(
            t.check(Some("rd"), true),
            Err(AuthError::Forbidden)
        ));
        assert!(matches!(
            t.check(Some("nope"), false),
            Err(AuthError::Unauthorized)
        ));
        assert!(matches!(t.check(None, false), Err(AuthError::Unauthorized)));
    }

    #[tokio::test]
    async fn refusals_answer_in_openai_shape() {
        for (refusal, status, body) in [
            (
                AuthError::Unauthorized,
                StatusCode::UNAUTHORIZED,
                r#"{"error":{"message":"a valid bearer token is required","type":"authentication_error","param":null,"code":"invalid_token"}}"#,
            ),
            (
                AuthError::Forbidden,
                StatusCode::FORBIDDEN,
                r#"{"error":{"message":"this token may only read","type":"permission_error","param":null,"code":"insufficient_scope"}}"#,
            ),
        ] {
            let r = refusal.into_response();
            assert_eq!(r.status(), status);
            assert_eq!(
                r.headers().get(header::WWW_AUTHENTICATE).is_some(),
                status == StatusCode::UNAUTHORIZED
            );
            let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            assert_eq!(std::str::from_utf8(&bytes).unwrap(), body);
        }
    }

    #[test]
    fn a_missing_admin_token_is_generated() {
        let (t, origin) = Tokens::resolve(None, None).unwrap();
        assert_eq!(origin, Origin::Generated);
        assert_eq!(t.admin().len(), 32);
        assert_ne!(t.admin(), Tokens::resolve(None, None).unwrap().0.admin());
    }
}
