//! What each engine reports about itself, read once per worker at startup: the KV block
//! size the router hashes prompts with (vLLM's `cache_config_info` gauge in `/metrics`,
//! SGLang's `page_size` in `/server_info`) and the step budget the planner prices prefills
//! in (SGLang's `chunked_prefill_size`, in the same `/server_info`; vLLM publishes none).
//! One request per worker: an SGLang worker's `/server_info` answers both.

use std::collections::HashMap;
use std::time::Duration;

use ownerserve_planner::ids::{EngineKind, WorkerId};
use ownerserve_shim::load_metrics::kv_block_size;

use crate::registry::Registry;
use crate::upstream::{get_small, HttpClient};

/// What one engine reported; `None` where it reported nothing (or could not be asked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineReport {
    /// Tokens per KV block.
    pub block_size: Option<usize>,
    /// Prompt tokens one engine step computes (SGLang's `chunked_prefill_size` when
    /// chunked prefill is on).
    pub step_tokens: Option<u64>,
}

/// Asks every healthy worker once; a worker that is down now keeps what is configured
/// for it (a worker that joins later, from discovery, is not asked).
pub async fn read_all(
    registry: &Registry,
    client: &HttpClient,
    timeout: Duration,
) -> HashMap<WorkerId, EngineReport> {
    let mut out = HashMap::new();
    for w in registry.all().iter().filter(|w| w.is_healthy()) {
        let path = match w.spec.engine {
            EngineKind::Sglang => "/server_info",
            _ => "/metrics",
        };
        let body = match get_small(client, &w.spec.base_url, path, timeout).await {
            Ok((status, body)) if status.is_success() => body,
            _ => continue,
        };
        let report = match w.spec.engine {
            EngineKind::Sglang => of_server_info(&body),
            _ => EngineReport {
                block_size: std::str::from_utf8(&body)
                    .ok()
                    .and_then(kv_block_size)
                    .and_then(|b| usize::try_from(b).ok()),
                step_tokens: None,
            },
        };
        out.insert(w.id, report);
    }
    out
}

/// An SGLang `/server_info` body: its `page_size`, and its `chunked_prefill_size` when
/// chunked prefill is on (SGLang sends -1 or null when it is off, and then runs a prompt
/// in one step, which no budget describes).
fn of_server_info(body: &[u8]) -> EngineReport {
    let Ok(info) = serde_json::from_slice::<serde_json::Value>(body) else {
        return EngineReport::default();
    };
    let field = |name: &str| info.get(name).and_then(serde_json::Value::as_u64);
    EngineReport {
        block_size: field("page_size").and_then(|b| usize::try_from(b).ok()),
        step_tokens: field("chunked_prefill_size").filter(|&t| t > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_s_server_info_gives_its_page_size_and_its_chunk_unless_chunking_is_off() {
        assert_eq!(
            of_server_info(br#"{"chunked_prefill_size": 4096, "page_size": 16}"#),
            EngineReport {
                block_size: Some(16),
                step_tokens: Some(4096)
            }
        );
        let off = of_server_info(br#"{"chunked_prefill_size": -1, "page_size": 1}"#);
        assert_eq!((off.block_size, off.step_tokens), (Some(1), None));
        let null = of_server_info(br#"{"chunked_prefill_size": null}"#);
        assert_eq!(null, EngineReport::default());
        assert_eq!(of_server_info(b"not json"), EngineReport::default());
    }
}
