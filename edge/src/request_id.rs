//! Request ids: the client's `X-Request-Id` is kept (or one is made up); [`crate::tracked`]
//! puts it on the request, the response and the request's span.

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

/// A process-unique id: the process's start time and a counter,
/// `ownerserve-<start ms, hex>-<counter, hex>`.
fn fresh() -> HeaderValue {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("ownerserve-{started:x}-")
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Built on the stack, the counter's hex digits by hand: this runs on every request
    // without an id of its own, and `format!` of the whole id was ~1 µs of it.
    let mut buf = [0u8; 80];
    let head = prefix.len().min(buf.len() - 16);
    buf[..head].copy_from_slice(&prefix.as_bytes()[..head]);
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for (k, slot) in buf[head..head + digits].iter_mut().enumerate() {
        let nibble = (n >> (4 * (digits - 1 - k))) & 0xf;
        *slot = b"0123456789abcdef"[nibble as usize];
    }
    HeaderValue::from_bytes(&buf[..head + digits])
        .unwrap_or_else(|_| HeaderValue::from_static("ownerserve"))
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
        // `ownerserve-<start ms>-<counter>`, both in hex, the counter without leading zeros.
        let id = fresh();
        let parts: Vec<&str> = id.to_str().expect("ascii").split('-').collect();
        assert_eq!(parts.len(), 3, "{id:?}");
        assert_eq!(parts[0], "ownerserve");
        let counter = u64::from_str_radix(parts[2], 16).expect("hex counter");
        assert_eq!(format!("{counter:x}"), parts[2]);
        assert!(u128::from_str_radix(parts[1], 16).is_ok());
    }
}
