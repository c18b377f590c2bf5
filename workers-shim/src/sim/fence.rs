//! Epoch fencing: per session, the highest ownership epoch this worker has seen. A request
//! carrying a lower epoch comes from a router acting on a stale ownership view (the session
//! has moved on), so it is refused; equal or higher is accepted, and higher raises the
//! fence. Pure: the HTTP shell reads the claim from headers or bodies and maps
//! [`StaleEpoch`] to a 409.
//!
//! Beside the fence, the [`AcceptLog`]: the claims this worker accepted, in order, with
//! what for and when (time passed in by the shell). It is what an audit replays against
//! the directory's committed log to show that no worker served a session at an epoch the
//! directory never gave it (`GET /ownerserve/v1/fence/accepted`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::http::HeaderMap;

pub use crate::engines::{EPOCH_HEADER, SESSION_HEADER};

/// Sessions remembered before the oldest are forgotten.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// Accepted claims kept by the [`AcceptLog`] before the oldest are forgotten.
pub const ACCEPT_LOG_CAPACITY: usize = 65_536;

/// A session's epoch, as a request claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceClaim {
    pub session: String,
    pub epoch: u64,
}

/// A request's epoch is below what this worker has seen for its session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale epoch {epoch} for session {session}: this worker has seen epoch {seen}")]
pub struct StaleEpoch {
    pub session: String,
    pub epoch: u64,
    pub seen: u64,
}

/// Fence headers that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("header {EPOCH_HEADER} must be an unsigned integer, got {value:?}")]
    Epoch { value: String },
    #[error("header {SESSION_HEADER} must be visible ASCII")]
    Session,
}

impl FenceClaim {
    /// The claim in a request's headers: `None` unless both headers are present. A
    /// malformed epoch is an error even without a session header.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ClaimError> {
        let epoch = match headers.get(EPOCH_HEADER) {
            None => None,
            Some(v) => {
                let text = String::from_utf8_lossy(v.as_bytes());
                let parsed = text.trim().parse::<u64>();
                Some(parsed.map_err(|_| ClaimError::Epoch {
                    value: text.into_owned(),
                })?)
            }
        };
        let session = match headers.get(SESSION_HEADER) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| ClaimError::Session)?.to_owned()),
        };
        Ok(match (session, epoch) {
            (Some(session), Some(epoch)) => Some(Self { session, epoch }),
            _ => None,
        })
    }

    /// The claim of a body's optional `session` and `epoch` fields (both needed).
    pub fn from_fields(session: Option<&str>, epoch: Option<u64>) -> Option<Self> {
        Some(Self {
            session: session?.to_owned(),
            epoch: epoch?,
        })
    }
}

/// Highest epoch seen per session, bounded: beyond `capacity` sessions the oldest (by
/// first sighting) is forgotten.
#[derive(Debug, Clone)]
pub struct EpochFence {
    highest: HashMap<Arc<str>, u64>,
    order: VecDeque<Arc<str>>,
    capacity: usize,
}

impl Default for EpochFence {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl EpochFence {
    /// An empty fence remembering up to `capacity` sessions (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            highest: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Accepts a claim at or above the session's highest epoch, raising the fence to it;
    /// refuses a lower one.
    pub fn admit(&mut self, claim: &FenceClaim) -> Result<(), StaleEpoch> {
        if let Some(seen) = self.highest.get_mut(claim.session.as_str()) {
            if claim.epoch < *seen {
                return Err(StaleEpoch {
                    session: claim.session.clone(),
                    epoch: claim.epoch,
                    seen: *seen,
                });
            }
            *seen = claim.epoch;
            return Ok(());
        }
        if self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.highest.remove(&oldest);
            }
        }
        let session: Arc<str> = claim.session.as_str().into();
        self.order.push_back(session.clone());
        self.highest.insert(session, claim.epoch);
        Ok(())
    }

    /// The highest epoch seen for `session`.
    pub fn highest(&self, session: &str) -> Option<u64> {
        self.highest.get(session).copied()
    }
}

/// What a fenced request was accepted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedFor {
    /// A completion this worker generates (decodes): it serves the session's step.
    Generate,
    /// A prefill leg whose KV another worker decodes from.
    Prefill,
    /// A KV pull, fetch or drop (a copy, or the fence of a migration's old owner).
    Kv,
}

/// One accepted claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Accepted {
    pub session: String,
    pub epoch: u64,
    #[serde(rename = "for")]
    pub accepted_for: AcceptedFor,
    /// Wall-clock time of acceptance, Unix milliseconds (the shell's clock).
    pub at_unix_ms: u64,
}

/// The last [`ACCEPT_LOG_CAPACITY`] accepted claims, oldest first, and how many older ones
/// were forgotten (so an audit knows whether it saw everything).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AcceptLog {
    accepted: VecDeque<Accepted>,
    forgotten: u64,
}

impl AcceptLog {
    /// Records an accepted claim, forgetting the oldest beyond the capacity.
    pub fn record(&mut self, claim: &FenceClaim, accepted_for: AcceptedFor, at_unix_ms: u64) {
        if self.accepted.len() >= ACCEPT_LOG_CAPACITY {
            self.accepted.pop_front();
            self.forgotten += 1;
        }
        self.accepted.push_back(Accepted {
            session: claim.session.clone(),
            epoch: claim.epoch,
            accepted_for,
            at_unix_ms,
        });
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn claim(session: &str, epoch: u64) -> FenceClaim {
        FenceClaim {
            session: session.to_owned(),
            epoch,
        }
    }

    #[test]
    fn lower_epochs_are_refused_equal_and_higher_pass_and_higher_raises() {
        let mut fence = EpochFence::default();
        assert_eq!(fence.admit(&claim("s", 3)), Ok(()));
        assert_eq!(fence.admit(&claim("s", 3)), Ok(()));
        assert_eq!(
            fence.admit(&claim("s", 2)),
            Err(StaleEpoch {
                session: "s".into(),
                epoch: 2,
                seen: 3
            })
        );
        assert_eq!(fence.admit(&claim("s", 5)), Ok(()));
        assert_eq!(fence.highest("s"), Some(5));
        assert!(fence.admit(&claim("s", 4)).is_err());
        assert_eq!(fence.admit(&claim("other", 0)), Ok(()), "per session");
        assert_eq!(
            StaleEpoch {
                session: "s".into(),
                epoch: 4,
                seen: 5
            }
            .to_string(),
            "stale epoch 4 for session s: this worker has seen epoch 5"
        );
    }

    #[test]
    fn the_oldest_session_is_forgotten_beyond_capacity() {
        let mut fence = EpochFence::new(2);
        fence.admit(&claim("a", 9)).unwrap();
        fence.admit(&claim("b", 9)).unwrap();
        fence.admit(&claim("a", 10)).unwrap();
        fence.admit(&claim("c", 1)).unwrap();
        assert_eq!(fence.highest("a"), None);
        assert_eq!(fence.highest("b"), Some(9));
        assert_eq!(fence.admit(&claim("a", 1)), Ok(()), "forgotten: accepted");
    }

    #[test]
    fn the_accept_log_keeps_the_newest_claims_in_order_and_counts_the_forgotten() {
        let mut log = AcceptLog::default();
        for e in 0..ACCEPT_LOG_CAPACITY as u64 + 2 {
            log.record(&claim("s", e), AcceptedFor::Generate, 1_000 + e);
        }
        assert_eq!(log.forgotten, 2);
        assert_eq!(log.accepted.len(), ACCEPT_LOG_CAPACITY);
        assert_eq!(log.accepted.front().map(|a| a.epoch), Some(2));
        let json = serde_json::to_value(&log).expect("serialises");
        assert_eq!(json["accepted"][0]["for"], "generate");
        assert_eq!(json["forgotten"], 2);
    }

    #[test]
    fn claims_need_both_headers_and_a_numeric_epoch() {
        let mut h = HeaderMap::new();
        assert_eq!(FenceClaim::from_headers(&h), Ok(None));
        h.insert(SESSION_HEADER, HeaderValue::from_static("s1"));
        assert_eq!(FenceClaim::from_headers(&h), Ok(None));
        h.insert(EPOCH_HEADER, HeaderValue::from_static(" 7 "));
        assert_eq!(FenceClaim::from_headers(&h), Ok(Some(claim("s1", 7))));
        h.insert(EPOCH_HEADER, HeaderValue::from_static("-1"));
        assert!(matches!(
            FenceClaim::from_headers(&h),
            Err(ClaimError::Epoch { .. })
        ));
        h.remove(SESSION_HEADER);
        assert!(FenceClaim::from_headers(&h).is_err(), "checked alone too");
        assert_eq!(
            FenceClaim::from_fields(Some("s"), Some(1)),
            Some(claim("s", 1))
        );
        assert_eq!(FenceClaim::from_fields(None, Some(1)), None);
    }
}
