//! Request ids: the client's `X-Request-Id` is kept (or one is made up); [`crate::tracked`]
//! puts it on the request, the response and the request's span.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The header.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-given id kept; a longer (or non-printable) one is replaced.
const MAX_LEN: usize = 128;

/// The request's id: the client's if it is a short printable string, else a fresh one.
pub fn of(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&HEADER)
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= MAX_LEN && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(fresh)
}

/// A process-unique id: the process's start time and a counter.
fn fresh() -> HeaderValue {
    static STARTED_MS: OnceLock<u128> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let salt = *STARTED_MS.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Written on the stack: this runs on every request without an id of its own.
    let mut buf = [0u8; 64];
    let mut out = &mut buf[..];
    let room = out.len();
    let _ = write!(out, "ownerserve-{salt:x}-{n:x}");
    let len = room - out.len();
    HeaderValue::from_bytes(&buf[..len]).unwrap_or_else(|_| HeaderValue::from_static("ownerserve"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_is_kept_unless_it_is_too_long_or_unprintable() {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_static("client-id-1"));
        assert_eq!(of(&h), "client-id-1");
        h.insert(
            HEADER,
            HeaderValue::from_str(&"x".repeat(200)).expect("ascii"),
        );
        assert!(of(&h).to_str().expect("ascii").starts_with("ownerserve-"));
        h.insert(HEADER, HeaderValue::from_static("has space"));
        assert!(of(&h).to_str().expect("ascii").starts_with("ownerserve-"));
        assert_ne!(of(&HeaderMap::new()), of(&HeaderMap::new()));
    }
}
