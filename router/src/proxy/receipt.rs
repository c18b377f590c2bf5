//! The route receipt: what the router decided for a step and the cache it promised there,
//! sent with the answer (`x-ownerserve-receipt`), then checked against the `cached_tokens`
//! the engine reports in the same answer. A promise the engine did not keep (a miss), or a
//! cache the router did not know of (a surplus: a tokenizer or block-size mismatch, a lost
//! event stream), is counted per worker (`Worker::record_receipt`, exported by
//! `ops::metrics::fleet`) and alerted on (`configs/prometheus/alerts.yml`).

use std::sync::Arc;

use axum::http::HeaderValue;

use crate::fleet::kv::IndexMode;
use crate::fleet::registry::{Worker, RECEIPT_OUTCOMES};

/// What one step was routed as and promised.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub action: &'static str,
    /// Prompt tokens the router expects the engine to report cached.
    pub predicted_cached: u64,
    /// The ownership epoch the step ran under, if the directory fenced it.
    pub epoch: Option<u64>,
    /// How far the index of the worker's cache could be trusted when the step was planned.
    pub index: IndexMode,
    /// Whether the engine's report can be held to the promise: the whole step ran where the
    /// prefix was (no transfer leg, no fallback) on the prompt the router saw (not a
    /// Responses follow-up, which the engine runs after its stored conversation).
    pub checkable: bool,
    /// The engines' block size: a report within one block of the promise keeps it.
    pub block: u64,
    /// The priority rank the step carried to its engine (lower runs sooner:
    /// `admission::Class::engine_rank`).
    pub priority: i8,
}

impl Receipt {
    /// The most a vLLM-style engine can report cached for a prompt of `prompt` tokens
    /// whose first `cached_blocks` blocks it holds: it computes at least the last token.
    pub fn promise(prompt: u64, cached_blocks: u64, block: u64) -> u64 {
        let block = block.max(1);
        (cached_blocks * block).min(prompt.saturating_sub(1) / block * block)
    }

    /// `x-ownerserve-receipt`:
    /// `worker=…; action=…; predicted_cached=…; epoch=…; index=…; priority=…`.
    pub fn header(&self, worker: &str) -> Option<HeaderValue> {
        let epoch = self.epoch.map_or_else(|| "-".to_owned(), |e| e.to_string());
        HeaderValue::from_str(&format!(
            "worker={worker}; action={}; predicted_cached={}; epoch={epoch}; index={}; \
             priority={}",
            self.action,
            self.predicted_cached,
            self.index.name(),
            self.priority
        ))
        .ok()
    }
}

/// What the engine's report said of a receipt's promise (in `RECEIPT_OUTCOMES` order: a
/// worker counts them by index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Kept,
    Missed,
    Surplus,
    Unreported,
    Unchecked,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        RECEIPT_OUTCOMES[self as usize]
    }

    /// A report within one block of the promise keeps it. Less is a miss (the index held
    /// what the engine had lost); more is a surplus (the engine had what the index did not
    /// know: events lost or refused, a tokenizer unlike the engine's). Both mean the router
    /// routes on a cache it does not see.
    pub fn of(r: &Receipt, reported: Option<u64>) -> Self {
        match reported {
            _ if !r.checkable => Outcome::Unchecked,
            None => Outcome::Unreported,
            Some(n) if n + r.block < r.predicted_cached => Outcome::Missed,
            Some(n) if n > r.predicted_cached + r.block => Outcome::Surplus,
            Some(_) => Outcome::Kept,
        }
    }
}

/// The last `"cached_tokens": N` in `piece` (a body, or one event of a stream).
pub fn reported_in(piece: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"cached_tokens\":";
    let mut found = None;
    for at in memchr::memmem::find_iter(piece, KEY) {
        let rest = &piece[at + KEY.len()..];
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && digits <= 19 {
            found = std::str::from_utf8(&rest[..digits])
                .ok()
                .and_then(|d| d.parse().ok());
        }
    }
    found
}

/// Whether the client asked for the receipt in the answer's `usage`
/// (`x-ownerserve-receipt: usage`).
pub fn wanted_in_usage(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(crate::api::headers::RECEIPT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"usage"))
}

/// A receipt checked as its answer is relayed: counted on its worker once the body ended
/// well (lock-free counters, read into metrics at scrape time; its index mode follows them).
pub struct Check {
    receipt: Receipt,
    reported: Option<u64>,
    worker: Arc<Worker>,
    /// Written into the answer's `usage` too.
    in_usage: bool,
}

impl Check {
    pub fn new(receipt: Receipt, worker: Arc<Worker>, in_usage: bool) -> Self {
        Self {
            receipt,
            reported: None,
            worker,
            in_usage,
        }
    }

    /// Whether the answer's body is rewritten (its length changes).
    pub fn rewrites_body(&self) -> bool {
        self.in_usage
    }

    /// `piece` with the checked receipt put first in its `usage` object, when the client
    /// asked for it and `piece` has a `usage` object (read by [`Check::saw`] first).
    pub fn stamped(&self, piece: &[u8]) -> Option<bytes::Bytes> {
        const KEY: &[u8] = b"\"usage\":";
        if !self.in_usage {
            return None;
        }
        let at = memchr::memmem::rfind(piece, KEY)?;
        let rest = &piece[at + KEY.len()..];
        let brace = at + KEY.len() + rest.iter().position(|b| !b.is_ascii_whitespace())?;
        if piece[brace] != b'{' {
            return None;
        }
        let after = &piece[brace + 1..];
        let empty = after.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
        let object = serde_json::json!({
            "worker": self.worker.spec.name,
            "action": self.receipt.action,
            "predicted_cached_tokens": self.receipt.predicted_cached,
            "cached_tokens": self.reported,
            "epoch": self.receipt.epoch,
            "index": self.receipt.index.name(),
            "priority": self.receipt.priority,
            "outcome": Outcome::of(&self.receipt, self.reported).name(),
        });
        let mut out = Vec::with_capacity(piece.len() + 256);
        out.extend_from_slice(&piece[..=brace]);
        out.extend_from_slice(b"\"ownerserve_receipt\":");
        out.extend_from_slice(object.to_string().as_bytes());
        if !empty {
            out.push(b',');
        }
        out.extend_from_slice(after);
        Some(out.into())
    }

    /// The receipt's header.
    pub fn header(&self) -> Option<HeaderValue> {
        self.receipt.header(&self.worker.spec.name)
    }

    /// Reads a piece of the answer for the engine's report.
    pub fn saw(&mut self, piece: &[u8]) {
        if let Some(n) = reported_in(piece) {
            self.reported = Some(n);
        }
    }

    /// The answer ended well: counts the outcome.
    pub fn ended(self) {
        let outcome = Outcome::of(&self.receipt, self.reported);
        let checked = match (outcome, self.reported) {
            (Outcome::Kept | Outcome::Missed | Outcome::Surplus, Some(r)) => {
                Some((self.receipt.predicted_cached, r))
            }
            _ => None,
        };
        self.worker.record_receipt(outcome as usize, checked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(predicted: u64, checkable: bool) -> Receipt {
        Receipt {
            action: "colocate",
            predicted_cached: predicted,
            epoch: Some(3),
            index: IndexMode::Exact,
            checkable,
            block: 32,
            priority: -1,
        }
    }

    #[test]
    fn the_report_is_read_from_bodies_and_stream_events() {
        let body =
            br#"{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}"#;
        assert_eq!(reported_in(body), Some(64));
        assert_eq!(
            reported_in(br#"data: {"usage":{"cached_tokens": 96}}"#),
            Some(96)
        );
        assert_eq!(
            reported_in(br#"{"prompt_tokens_details":{"cached_tokens":null}}"#),
            None
        );
        assert_eq!(reported_in(b"data: {\"choices\":[]}"), None);
    }

    #[test]
    fn a_promise_is_kept_within_a_block_and_missed_below() {
        assert_eq!(Outcome::of(&receipt(640, true), Some(640)), Outcome::Kept);
        assert_eq!(Outcome::of(&receipt(640, true), Some(608)), Outcome::Kept);
        assert_eq!(Outcome::of(&receipt(640, true), Some(672)), Outcome::Kept);
        assert_eq!(
            Outcome::of(&receipt(640, true), Some(800)),
            Outcome::Surplus
        );
        assert_eq!(Outcome::of(&receipt(640, true), Some(0)), Outcome::Missed);
        assert_eq!(Outcome::of(&receipt(640, true), None), Outcome::Unreported);
        assert_eq!(
            Outcome::of(&receipt(640, false), Some(0)),
            Outcome::Unchecked
        );
    }

    #[test]
    fn the_promise_leaves_the_last_token_to_compute() {
        assert_eq!(Receipt::promise(1000, 40, 32), 992);
        assert_eq!(Receipt::promise(1024, 32, 32), 992);
        assert_eq!(Receipt::promise(1024, 10, 32), 320);
        assert_eq!(Receipt::promise(0, 10, 32), 0);
    }

    #[test]
    fn the_receipt_goes_first_in_the_usage_when_asked() {
        let worker = test_worker();
        let check = |in_usage| {
            let mut c = Check::new(receipt(640, true), worker.clone(), in_usage);
            c.saw(
                br#"{"usage":{"prompt_tokens":700,"prompt_tokens_details":{"cached_tokens":640}}}"#,
            );
            c
        };
        let body = br#"{"id":"x","usage":{"prompt_tokens":700,"prompt_tokens_details":{"cached_tokens":640}}}"#;
        assert_eq!(check(false).stamped(body), None);
        let stamped = check(true).stamped(body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&stamped).unwrap();
        assert_eq!(
            v["usage"]["ownerserve_receipt"],
            serde_json::json!({"worker": "w0", "action": "colocate",
                "predicted_cached_tokens": 640, "cached_tokens": 640, "epoch": 3,
                "index": "exact", "priority": -1, "outcome": "kept"})
        );
        assert_eq!(v["usage"]["prompt_tokens"], 700);
        // A stream's usage event, an empty usage, and a null one (left alone).
        let event = b"data: {\"choices\":[],\"usage\": {}}\n\n";
        let stamped = check(true).stamped(event).unwrap();
        let json = stamped.strip_prefix(b"data: ").unwrap();
        let v: serde_json::Value = serde_json::from_slice(json.trim_ascii()).unwrap();
        assert_eq!(v["usage"]["ownerserve_receipt"]["outcome"], "kept");
        assert_eq!(check(true).stamped(br#"{"usage":null}"#), None);
    }

    fn test_worker() -> Arc<Worker> {
        use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
        let spec = crate::config::WorkerSpec::new(
            "w0",
            "http://127.0.0.1:9",
            Role::Hybrid,
            EngineKind::Sim,
        );
        crate::fleet::registry::Registry::new(vec![spec])
            .get(WorkerId(0))
            .expect("worker")
    }

    #[test]
    fn the_header_names_every_field() {
        let h = receipt(640, true).header("w0").unwrap();
        assert_eq!(
            h.to_str().unwrap(),
            "worker=w0; action=colocate; predicted_cached=640; epoch=3; index=exact; priority=-1"
        );
    }
}
