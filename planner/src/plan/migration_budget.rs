//! The planner's migration budget: a cap on the KV its moves ship, and a price that rises
//! toward it.
//!
//! Each move is priced to pay for itself (its copy, with hysteresis, against the queue and
//! decode it saves), but the prices are estimates, and on traffic the planner was never
//! tuned on they can favour moves step after step: Llama-3.1-8B SWE-smith ×200 on eight
//! H20s (a GPU no run of the evaluation matrix uses) moved 11–13% of its prompts' KV, over
//! the 10% the evaluation accepts. So the moves a planner chooses ship at most
//! `Weights::migration_budget` of the KV bytes of the prompts it has routed (0.1 by
//! default, `f64::INFINITY` for none). A hard cap alone spends the budget on whichever
//! moves come first and then refuses the ones that matter (on those runs p99 TTFT went
//! from 5 s to 16 s), so past half the budget each move's hysteresis grows as a shadow price,
//! `(s − ½) / (1 − s)` more for a budget `s` spent, keeping the budget for the moves that
//! save the most. A hand-over off an owner that cannot keep the session (draining) is not
//! capped or priced so; its bytes count.

/// What is left of the migration budget for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MigrationBudget {
    /// Bytes a move may still send: the budget's share of the prompts routed so far, this
    /// step's included, less what moves already shipped. A move that would send more is
    /// not a candidate.
    pub room_bytes: f64,
    /// Share of that budget already spent, 0 to 1.
    pub spent: f64,
}

impl MigrationBudget {
    /// No budget: every move is a candidate at its own price.
    pub const UNLIMITED: Self = Self {
        room_bytes: f64::INFINITY,
        spent: 0.0,
    };

    /// The budget of a planner allowed to move `share` of the `prompt_bytes` it has routed
    /// (this step's included), having moved `moved_bytes`.
    pub fn of(share: f64, prompt_bytes: f64, moved_bytes: f64) -> Self {
        // Tested on the share, not the product: no budget times no prompt bytes yet (an
        // empty first prompt) is NaN, which would refuse every move.
        if share.is_infinite() {
            return Self::UNLIMITED;
        }
        let allowed = share.max(0.0) * prompt_bytes;
        let spent = if allowed > 0.0 {
            (moved_bytes / allowed).clamp(0.0, 1.0)
        } else {
            1.0
        };
        Self {
            room_bytes: allowed - moved_bytes,
            spent,
        }
    }

    /// Whether a move that sends `bytes` fits.
    pub fn allows(&self, bytes: f64) -> bool {
        bytes <= self.room_bytes
    }

    /// How much more hysteresis a move pays, as a multiple of the configured one: 0 up to
    /// half the budget spent, then `(s − ½) / (1 − s)`, without bound as `s` nears 1.
    pub fn shadow_price(&self) -> f64 {
        if self.spent <= 0.5 {
            0.0
        } else if self.spent >= 1.0 {
            f64::INFINITY
        } else {
            (self.spent - 0.5) / (1.0 - self.spent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_price_is_free_to_half_the_budget_then_rises_to_the_cap() {
        let at = |moved: f64| MigrationBudget::of(0.1, 1_000.0, moved);
        assert_eq!(at(0.0).shadow_price(), 0.0);
        assert_eq!(at(50.0).shadow_price(), 0.0);
        assert!((at(75.0).shadow_price() - 1.0).abs() < 1e-12);
        assert!(at(99.0).shadow_price() > 40.0);
        assert_eq!(at(100.0).shadow_price(), f64::INFINITY);
        assert!(at(60.0).allows(40.0) && !at(60.0).allows(41.0));
        assert!(MigrationBudget::of(f64::INFINITY, 1.0, 5.0).allows(1e30));
        assert!(MigrationBudget::of(f64::INFINITY, 0.0, 0.0).allows(1e30));
        assert!(!MigrationBudget::of(0.0, 1_000.0, 0.0).allows(1.0));
    }
}
