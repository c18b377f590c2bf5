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

/// Whether a new session whose first prompt is `tokens` may start while the live sessions'
/// contexts total `live_tokens` on a fleet holding `capacity_tokens` of KV (the HBM the
/// engines report; a host tier is not reported, so admission is conservative beside one).
/// The first session always starts: one that does not fit alone would wait forever.
pub fn admits(live_tokens: u64, tokens: u64, capacity_tokens: u64) -> bool {
    live_tokens == 0 || live_tokens.saturating_add(tokens) <= capacity_tokens
}

#[cfg(test)]
mod tests {
    use super::admits;

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
