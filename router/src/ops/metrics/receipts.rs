//! Route receipts checked against the engines: per worker, the steps whose promised cache
//! the engine's `cached_tokens` kept or missed (a silent miss: the router's index and the
//! engine disagree), and the tokens promised and reported.

use prometheus::{IntCounterVec, Registry};

use ownerserve_edge::exposition::counter_vec;

#[derive(Debug, Clone)]
pub struct ReceiptMetrics {
    receipts: IntCounterVec,
    promised: IntCounterVec,
    reported: IntCounterVec,
}

impl ReceiptMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            receipts: counter_vec(
                registry,
                "ownerserve_cache_receipts_total",
                "Answered steps by worker and what the engine's cached_tokens said of the cache the router promised: kept (within a block), missed (less), surplus (more: the router did not see that cache), unreported (no usage in the answer), unchecked (a transfer leg, whose reuse the decode engine reports its own way).",
                &["worker", "outcome"],
            )?,
            promised: counter_vec(
                registry,
                "ownerserve_cache_promised_tokens_total",
                "Prompt tokens the router predicted the worker would find cached, on steps whose answer reported cached_tokens.",
                &["worker"],
            )?,
            reported: counter_vec(
                registry,
                "ownerserve_cache_reported_tokens_total",
                "Prompt tokens the worker's engine reported cached (usage.prompt_tokens_details.cached_tokens) on those steps.",
                &["worker"],
            )?,
        })
    }

    /// Counts one answered step on `worker` (`outcome`: `proxy::receipt::Outcome`'s name);
    /// `checked`: its promise and the engine's report, when both count.
    pub fn record(&self, worker: &str, outcome: &str, checked: Option<(u64, u64)>) {
        self.receipts.with_label_values(&[worker, outcome]).inc();
        if let Some((promised, reported)) = checked {
            self.promised.with_label_values(&[worker]).inc_by(promised);
            self.reported.with_label_values(&[worker]).inc_by(reported);
        }
    }
}
