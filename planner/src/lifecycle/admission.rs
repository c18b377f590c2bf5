//! Session admission: a new session starts only while the fleet's KV memory can hold its
//! context beside the contexts of the sessions already live.
//!
//! A live session (one that has started and neither ended nor lapsed) comes back after
//! every tool call to a prefix of its whole context. When the live contexts outgrow the
//! fleet's KV memory, every return finds its prefix evicted by the others' and prefills it
//! again: the LRU thrashes, whatever the lifecycle keeps (on the `long-gap` workload, 48
//! sessions of 30–120K tokens on four GPUs holding 1.7M tokens, 89% of what returning
//! steps had sent before was recomputed). Holding a new session's first step until a live
//! one ends keeps the working set within memory; the wait is the first step's (its TTFT
//! counts it), and no step of a started session ever waits for admission.

/// The most of the fleet's KV admission may keep for the live sessions' growth.
pub const MAX_HEADROOM: f64 = 0.9;

/// The KV, tokens, the live sessions' contexts may fill before a new session waits: the
/// fleet's `capacity_tokens` less a `headroom` share (clamped to `0..=MAX_HEADROOM`) kept
/// for the live sessions' growth. An agent's context grows every turn (Claude Code's
/// sessions from ~28K tokens at their first step to ~75K on average), so a fleet filled to
/// its capacity by first steps overflows a few turns later, and every return recomputes
/// what the others evicted. The headroom trades first steps' waits for returns' hits;
/// docs/EVALUATION.md ("Tool gaps") measures the trade.
pub fn admission_room(capacity_tokens: u64, headroom: f64) -> u64 {
    let kept = if headroom.is_finite() {
        headroom.clamp(0.0, MAX_HEADROOM)
    } else {
        0.0
    };
    (capacity_tokens as f64 * (1.0 - kept)) as u64
}

/// Whether a new session whose first prompt is `tokens` may start while the live sessions'
/// contexts total `live_tokens` on a fleet holding `capacity_tokens` of KV (the HBM the
/// engines report; a host tier is not reported, so admission is conservative beside one).
/// The first session always starts: one that does not fit alone would wait forever.
pub fn admits(live_tokens: u64, tokens: u64, capacity_tokens: u64) -> bool {
    live_tokens == 0 || live_tokens.saturating_add(tokens) <= capacity_tokens
}

#[cfg(test)]
mod tests {
    use super::{admission_room, admits, MAX_HEADROOM};

    #[test]
    fn headroom_keeps_a_share_of_the_fleets_kv_for_growth() {
        assert_eq!(admission_room(1_000, 0.0), 1_000);
        assert_eq!(admission_room(1_000, 0.4), 600);
        // Never all of it, and nonsense is no headroom.
        assert_eq!(
            admission_room(1_000, 2.0),
            admission_room(1_000, MAX_HEADROOM)
        );
        assert_eq!(admission_room(1_000, -1.0), 1_000);
        assert_eq!(admission_room(1_000, f64::NAN), 1_000);
        // A session that fits the capacity may wait for the room.
        assert!(admits(500, 100, 1_000));
        assert!(!admits(500, 100, admission_room(1_000, 0.5)));
    }

    #[test]
    fn a_session_starts_while_the_live_contexts_and_its_own_fit() {
        assert!(admits(0, 10, 100));
        assert!(admits(60, 40, 100));
        assert!(!admits(61, 40, 100));
        // Alone, even a context larger than the fleet's memory starts.
        assert!(admits(0, 1_000, 100));
        assert!(!admits(u64::MAX, 1, 100));
    }
}
