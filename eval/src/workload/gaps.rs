//! Empirical tool-gap samples for the generators, taken from the SWE-smith derived trace.

use std::path::Path;

use super::{agentic, WorkloadError};

/// The `tool_gap_ms` of every call that has a next call in its session, from the derived
/// SWE-smith JSONL at `path`. The last call's gap is left out: no tool time follows it.
pub fn swe_smith_gaps(path: impl AsRef<Path>) -> Result<Vec<f64>, WorkloadError> {
    let w = agentic::read(path)?;
    Ok(w.sessions
        .iter()
        .flat_map(|s| {
            let n = s.steps.len().saturating_sub(1);
            s.steps.iter().take(n).map(|st| st.gap_after_ms)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_exclude_each_sessions_last_call() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/traces/continuum_swesmith_derived.jsonl"
        );
        let gaps = swe_smith_gaps(path).expect("read gaps");
        assert_eq!(gaps.len(), 120);
        // Bimodal: editor calls under 1 ms, bash runs around half a second.
        assert!(gaps.iter().all(|g| (0.0..1000.0).contains(g)));
        assert!(gaps.iter().any(|&g| g > 400.0));
        assert!(gaps.iter().any(|&g| g < 1.0));
    }
}
