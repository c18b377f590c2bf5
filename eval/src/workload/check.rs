//! The workload contract as a check, for tests and for consumers of hand-built workloads.

use std::collections::HashSet;

use super::{blocks_for, Loop, Workload};

/// The first way a workload breaks the contract of [`Workload`]'s fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The block size is zero.
    #[error("hash block is zero")]
    ZeroBlock,
    /// Two sessions share an id.
    #[error("session id {id} is used twice")]
    DuplicateSessionId {
        /// The repeated id.
        id: String,
    },
    /// A step's `hash_ids` is not ceil(input_tokens / hash_block) long.
    #[error("session {session} step {step}: {found} hash ids, expected {expected}")]
    HashIdsLength {
        /// Session index.
        session: usize,
        /// Step index.
        step: usize,
        /// ceil(input_tokens / hash_block).
        expected: usize,
        /// `hash_ids.len()`.
        found: usize,
    },
    /// Open loop without an arrival, closed loop with one, or open-loop arrivals out of order.
    #[error("session {session} step {step}: arrival time does not fit the loop")]
    Arrival {
        /// Session index.
        session: usize,
        /// Step index.
        step: usize,
    },
    /// `samples` is zero.
    #[error("session {session} step {step}: zero samples")]
    ZeroSamples {
        /// Session index.
        session: usize,
        /// Step index.
        step: usize,
    },
    /// `fork_of` names a session or step that does not exist, or the session itself.
    #[error("session {session}: fork_of points nowhere")]
    ForkOutOfRange {
        /// Session index.
        session: usize,
    },
}

pub(super) fn check(w: &Workload) -> Result<(), Violation> {
    if w.hash_block == 0 {
        return Err(Violation::ZeroBlock);
    }
    let mut ids = HashSet::new();
    for (si, s) in w.sessions.iter().enumerate() {
        if !ids.insert(s.id.as_str()) {
            return Err(Violation::DuplicateSessionId { id: s.id.clone() });
        }
        if let Some(f) = s.fork_of {
            let exists = w
                .sessions
                .get(f.session)
                .is_some_and(|p| f.step < p.steps.len());
            if !exists || f.session == si {
                return Err(Violation::ForkOutOfRange { session: si });
            }
        }
        let mut last_arrival = f64::NEG_INFINITY;
        for (i, step) in s.steps.iter().enumerate() {
            let expected = blocks_for(step.input_tokens, w.hash_block);
            if step.hash_ids.len() != expected {
                return Err(Violation::HashIdsLength {
                    session: si,
                    step: i,
                    expected,
                    found: step.hash_ids.len(),
                });
            }
            let arrival_ok = match (w.looping, step.arrival_ms) {
                (Loop::Open, Some(t)) => {
                    let ok = t.is_finite() && t >= last_arrival;
                    last_arrival = t;
                    ok
                }
                (Loop::Closed, None) => true,
                _ => false,
            };
            if !arrival_ok {
                return Err(Violation::Arrival {
                    session: si,
                    step: i,
                });
            }
            if step.samples == 0 {
                return Err(Violation::ZeroSamples {
                    session: si,
                    step: i,
                });
            }
        }
    }
    Ok(())
}
