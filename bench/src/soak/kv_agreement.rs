//! Whether the routers' KV indexes agree at the end of a soak. Every router follows the
//! same engines' events, and a restarted one copies a running peer's index before it does
//! (`router.kv.peers`), so once the indexes stop changing each worker's digest should be
//! the same on every router; a router that missed history (a chain stored before an
//! engine's replay buffer begins) differs, and refuses the blocks stored under it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::topology::get_json;

/// Per router: each worker's digest, and the events its index refused.
type Views = Vec<(BTreeMap<String, String>, u64)>;

async fn read(http: &reqwest::Client, routers: &[String]) -> Views {
    let mut views = Vec::with_capacity(routers.len());
    for url in routers {
        let kv = get_json(http, &format!("{url}/admin/v1/kv")).await;
        let digests = kv["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter_map(|w| {
                        Some((
                            w["id"].as_str()?.to_owned(),
                            w["digest"].as_str()?.to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let refused = kv["stats"]["events_rejected"].as_u64().unwrap_or(0);
        views.push((digests, refused));
    }
    views
}

/// The report's line: workers whose digest is the same on every router (read until two
/// reads a second apart agree, 20 s at most), and the events each router refused.
pub async fn line(http: &reqwest::Client, routers: &[String], names: &[String]) -> String {
    let mut last = read(http, routers).await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = read(http, routers).await;
        let settled = now == last;
        last = now;
        if settled {
            break;
        }
    }
    let workers: Vec<&String> = last
        .first()
        .map(|(d, _)| d.keys().collect())
        .unwrap_or_default();
    let alike = workers
        .iter()
        .filter(|w| {
            let first = last.first().and_then(|(d, _)| d.get(**w));
            first.is_some() && last.iter().all(|(d, _)| d.get(**w) == first)
        })
        .count();
    let refused: Vec<String> = names
        .iter()
        .zip(&last)
        .map(|(name, (_, r))| format!("{name} {r}"))
        .collect();
    format!(
        "KV indexes: {alike} of {} workers alike on every router; events refused: {}",
        workers.len(),
        refused.join(", ")
    )
}
