//! What each engine reports about itself, read once per worker at startup: the KV block
//! size the router hashes prompts with (vLLM's `cache_config_info` gauge in `/metrics`,
//! SGLang's `page_size` in `/server_info`) and the step budget the planner prices prefills
//! in (SGLang's `chunked_prefill_size`, in the same `/server_info`; vLLM publishes none).
//! One request per worker, at the path its engine's protocol names and read by its parser
//! (`EngineProtocol::self_report_path`, `read_self_report`); this file does the IO.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use ownerserve_planner::ids::{EngineKind, WorkerId};
use ownerserve_shim::engines;

use crate::fleet::registry::Registry;
use crate::upstream::{get_small, HttpClient};

/// What one engine reported; `None` where it reported nothing (or could not be asked).
pub use ownerserve_shim::engines::EngineReport;

/// Asks every healthy worker once, all at the same time, so startup waits at most one
/// `timeout` however many engines are slow to answer; a worker that is down now keeps
/// what is configured for it (a worker that joins later, from discovery, is not asked).
pub async fn read_all(
    registry: &Registry,
    client: &HttpClient,
    timeout: Duration,
) -> HashMap<WorkerId, EngineReport> {
    let fleet = registry.all();
    let asks = fleet.iter().filter(|w| w.is_healthy()).map(|w| async move {
        Some((
            w.id,
            read_one(client, w.spec.engine, &w.spec.base_url, timeout).await?,
        ))
    });
    join_all(asks).await.into_iter().flatten().collect()
}

/// One engine's report, or `None` when it did not answer in `timeout` with a success.
async fn read_one(
    client: &HttpClient,
    engine: EngineKind,
    base_url: &str,
    timeout: Duration,
) -> Option<EngineReport> {
    let protocol = engines::protocol(engine);
    let path = protocol.self_report_path();
    match get_small(client, base_url, path, timeout).await {
        Ok((status, body)) if status.is_success() => Some(protocol.read_self_report(&body)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::ids::Role;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::config::WorkerSpec;
    use crate::upstream::client;

    /// A vLLM-like engine whose `/metrics` (block size 32) answers `delay` after each
    /// request; it runs as long as the returned set is kept.
    async fn slow_engine(delay: Duration) -> (String, tokio::task::JoinSet<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("has an address");
        let mut engine = tokio::task::JoinSet::new();
        engine.spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                tokio::time::sleep(delay).await;
                let body = "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\"} 1.0\n";
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                let _ = conn.write_all(format!("{head}{body}").as_bytes()).await;
            }
        });
        (format!("http://{addr}"), engine)
    }

    #[tokio::test]
    async fn every_engine_is_asked_at_once_so_slow_ones_cost_one_wait() {
        // Four engines that each take 0.5 s: one after another that is 2 s of startup.
        let delay = Duration::from_millis(500);
        let (mut specs, mut engines) = (Vec::new(), Vec::new());
        for i in 0..4 {
            let (url, engine) = slow_engine(delay).await;
            specs.push(WorkerSpec::new(
                &format!("w{i}"),
                &url,
                Role::Hybrid,
                EngineKind::Vllm,
            ));
            engines.push(engine);
        }
        let registry = Registry::new(specs);
        for w in registry.all().iter() {
            w.mark_healthy(Vec::new());
        }
        let started = std::time::Instant::now();
        let reports = read_all(
            &registry,
            &client(Duration::from_secs(1)),
            Duration::from_secs(5),
        )
        .await;
        let took = started.elapsed();
        assert_eq!(reports.len(), 4);
        assert!(
            reports.values().all(|r| r.block_size == Some(32)),
            "{reports:?}"
        );
        assert!(
            took < delay * 3,
            "took {took:?}: the engines were asked one after another"
        );
    }
}
