//! Tenants' fleet-wide budgets ([`crate::tenant_budgets`]): tokens granted from a bucket,
//! and sessions held against a limit.

use super::{Outcome, Rejection};
use crate::ids::SessionId;
use crate::state::Directory;
use crate::tenant_budgets::{TenantBudget, MAX_TENANTS, MAX_TENANT_BYTES, MAX_TENANT_SESSIONS};

impl Directory {
    /// The tenant's budget, created if there is room.
    fn budget(&mut self, tenant: &str) -> Result<&mut TenantBudget, Rejection> {
        if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES {
            return Err(Rejection::BadTenant {
                max_bytes: MAX_TENANT_BYTES,
                max_tenants: MAX_TENANTS,
            });
        }
        if !self.tenants.contains_key(tenant) && self.tenants.len() >= MAX_TENANTS {
            return Err(Rejection::BadTenant {
                max_bytes: MAX_TENANT_BYTES,
                max_tenants: MAX_TENANTS,
            });
        }
        let now_ms = self.now_ms;
        Ok(self
            .tenants
            .entry(tenant.to_owned())
            .or_insert_with(|| TenantBudget {
                refilled_ms: now_ms,
                ..TenantBudget::default()
            }))
    }

    /// Grants `tokens` from the tenant's bucket while it is above zero (the grant may take
    /// it below); otherwise says how long until it is.
    pub(super) fn spend_tokens(&mut self, tenant: &str, tokens: u64, per_minute: u64) -> Outcome {
        let now_ms = self.now_ms;
        let new = !self.tenants.contains_key(tenant);
        let b = match self.budget(tenant) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        if new {
            // A tenant's first minute starts with a full bucket.
            b.tokens = TenantBudget::burst(per_minute);
        }
        b.refill(per_minute, now_ms);
        if b.tokens <= 0 {
            return Outcome::TokensRefused {
                wait_ms: b.wait_ms(per_minute),
            };
        }
        b.tokens = b
            .tokens
            .saturating_sub(i64::try_from(tokens).unwrap_or(i64::MAX));
        b.granted = b.granted.saturating_add(tokens);
        Outcome::TokensGranted { tokens }
    }

    /// Holds `session`'s place among the tenant's live sessions until `ttl_ms` from now:
    /// a session already holding one renews it; a new one gets one while fewer than `max`
    /// are live.
    pub(super) fn hold_tenant_session(
        &mut self,
        tenant: &str,
        session: &SessionId,
        max: u32,
        ttl_ms: u64,
    ) -> Outcome {
        let now_ms = self.now_ms;
        let b = match self.budget(tenant) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        b.lapse(now_ms);
        let live = u32::try_from(b.sessions.len()).unwrap_or(u32::MAX);
        let until = now_ms.saturating_add(ttl_ms);
        if let Some(held) = b.sessions.get_mut(session) {
            *held = until;
        } else if live >= max.min(MAX_TENANT_SESSIONS) {
            return Outcome::SessionRefused { live };
        } else {
            b.sessions.insert(session.clone(), until);
        }
        Outcome::SessionHeld {
            until_ms: until,
            live: u32::try_from(b.sessions.len()).unwrap_or(u32::MAX),
        }
    }

    /// Gives up `session`'s place among the tenant's sessions (the session ended).
    pub(super) fn release_tenant_session(&mut self, tenant: &str, session: &SessionId) -> Outcome {
        if let Some(b) = self.tenants.get_mut(tenant) {
            b.sessions.remove(session);
        }
        Outcome::Released
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Envelope};
    use crate::ids::SessionId;
    use crate::outcome::Outcome;
    use crate::state::Directory;

    fn at(d: &mut Directory, index: &mut u64, now_ms: u64, command: Command) -> Outcome {
        *index += 1;
        d.apply(
            *index,
            &Envelope {
                now_ms,
                client: None,
                command,
            },
        )
    }

    fn spend(tokens: u64) -> Command {
        Command::SpendTokens {
            tenant: "acme".into(),
            tokens,
            per_minute: 60_000,
        }
    }

    #[test]
    fn a_minute_grants_its_rate_plus_the_burst_and_one_overdraft_at_most() {
        let (mut d, mut i) = (Directory::new(0), 0);
        // Chunks of 500 asked every 100 ms for ten minutes (twice the rate allowed).
        let mut granted_in_minute = [0u64; 10];
        for t in 0..6_000u64 {
            let now = 1_000 + t * 100;
            if let Outcome::TokensGranted { tokens } = at(&mut d, &mut i, now, spend(500)) {
                granted_in_minute[(t / 600) as usize] += tokens;
            }
        }
        for (m, g) in granted_in_minute.iter().enumerate() {
            // 60,000 a minute, a 3,000 burst, one 500 overdraft.
            assert!(*g <= 60_000 + 3_000 + 500, "minute {m}: {g}");
            assert!(*g >= 57_000, "minute {m}: {g}: the rate is given");
        }
    }

    #[test]
    fn a_refusal_says_when_the_bucket_refills() {
        let (mut d, mut i) = (Directory::new(0), 0);
        // The bucket starts full (3,000) and refills 1 token/ms.
        assert_eq!(
            at(&mut d, &mut i, 0, spend(5_000)),
            Outcome::TokensGranted { tokens: 5_000 }
        );
        // 3,000 + 10 - 5,000 left: 1,991 ms until above zero.
        assert_eq!(
            at(&mut d, &mut i, 10, spend(1)),
            Outcome::TokensRefused { wait_ms: 1_991 }
        );
    }

    #[test]
    fn sessions_hold_a_place_until_idle_or_released_and_a_full_tenant_refuses() {
        let (mut d, mut i) = (Directory::new(0), 0);
        let hold = |s: &str| Command::HoldTenantSession {
            tenant: "acme".into(),
            session: SessionId(s.into()),
            max: 2,
            ttl_ms: 1_000,
        };
        assert!(matches!(
            at(&mut d, &mut i, 0, hold("a")),
            Outcome::SessionHeld { live: 1, .. }
        ));
        assert!(matches!(
            at(&mut d, &mut i, 0, hold("b")),
            Outcome::SessionHeld { live: 2, .. }
        ));
        assert_eq!(
            at(&mut d, &mut i, 500, hold("c")),
            Outcome::SessionRefused { live: 2 }
        );
        // A live session renews its place.
        assert!(matches!(
            at(&mut d, &mut i, 900, hold("a")),
            Outcome::SessionHeld {
                until_ms: 1_900,
                ..
            }
        ));
        // b lapses at 1,000: c gets its place.
        assert!(matches!(
            at(&mut d, &mut i, 1_000, hold("c")),
            Outcome::SessionHeld { live: 2, .. }
        ));
        at(
            &mut d,
            &mut i,
            1_100,
            Command::ReleaseTenantSession {
                tenant: "acme".into(),
                session: SessionId("a".into()),
            },
        );
        assert!(matches!(
            at(&mut d, &mut i, 1_100, hold("d")),
            Outcome::SessionHeld { live: 2, .. }
        ));
    }

    #[test]
    fn tenant_names_and_counts_are_bounded() {
        let (mut d, mut i) = (Directory::new(0), 0);
        let long = Command::SpendTokens {
            tenant: "x".repeat(129),
            tokens: 1,
            per_minute: 1,
        };
        assert!(matches!(
            at(&mut d, &mut i, 0, long),
            Outcome::Rejected(crate::outcome::Rejection::BadTenant { .. })
        ));
    }
}
