//! Tenants' budgets held fleet-wide: each tenant's tokens-per-minute bucket and its live
//! sessions, so every router replica spends from one budget (a limit per replica lets a
//! tenant use N budgets through N routers). Routers take tokens in chunks
//! (`Command::SpendTokens`) and spend them locally; a session holds its place
//! (`Command::HoldTenantSession`) until it is idle for its TTL or closed.
//!
//! A bucket holds at most a twentieth of a minute's tokens and refills at the tenant's rate,
//! so over any minute the directory grants at most `1.05 × per_minute` plus one overdraft
//! (a grant is given whenever the bucket is above zero, and may take it below).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::SessionId;

/// Longest tenant name, bytes.
pub const MAX_TENANT_BYTES: usize = 128;
/// Most tenants the directory keeps budgets for.
pub const MAX_TENANTS: usize = 10_000;
/// Most sessions one tenant may be allowed at once.
pub const MAX_TENANT_SESSIONS: u32 = 1_000_000;

/// A minute, in ms.
const MINUTE_MS: u64 = 60_000;

/// One tenant's budgets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantBudget {
    /// Tokens left in the bucket (below zero after an overdraft).
    pub tokens: i64,
    /// When the bucket was last refilled (directory time).
    pub refilled_ms: u64,
    /// Tokens granted in all.
    pub granted: u64,
    /// Its live sessions and when each lapses.
    pub sessions: BTreeMap<SessionId, u64>,
}

impl TenantBudget {
    /// The bucket's size for `per_minute`.
    pub fn burst(per_minute: u64) -> i64 {
        i64::try_from((per_minute / 20).max(1)).unwrap_or(i64::MAX)
    }

    /// Refills the bucket to `now_ms` at `per_minute`.
    pub fn refill(&mut self, per_minute: u64, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.refilled_ms);
        let added = u128::from(per_minute) * u128::from(elapsed) / u128::from(MINUTE_MS);
        let added = i64::try_from(added).unwrap_or(i64::MAX);
        self.tokens = self
            .tokens
            .saturating_add(added)
            .min(Self::burst(per_minute));
        self.refilled_ms = now_ms;
    }

    /// Ms until the bucket is above zero again at `per_minute`.
    pub fn wait_ms(&self, per_minute: u64) -> u64 {
        let short = u128::from(self.tokens.unsigned_abs()) + 1;
        let ms = short * u128::from(MINUTE_MS) / u128::from(per_minute.max(1));
        u64::try_from(ms).unwrap_or(u64::MAX).max(1)
    }

    /// Drops the sessions lapsed by `now_ms`.
    pub fn lapse(&mut self, now_ms: u64) {
        self.sessions.retain(|_, until| *until > now_ms);
    }
}
