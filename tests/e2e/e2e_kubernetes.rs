//! Kubernetes worker discovery against a fake API server (`common::fake_kube`, axum on
//! 127.0.0.1 serving LIST and WATCH), driven through the real `kube` client in a real
//! `ownerserve router`: pods added, turned not ready, deleted, changed behind a `410 Gone`
//! and after a severed watch each show in `/admin/v1/workers` within 2 s; a deleted pod's
//! sessions are served by a new owner on their next step.
#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]
#![allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "tests report timings and bench figures"
)]

use crate::common;

use std::time::{Duration, Instant};

use common::fake_kube::{FakeKube, FakePod};
use common::{chat_body, client, eventually, free_port, get_json, temp_config, Proc};
use serde_json::Value;

/// How soon a pod's change must show in the router's worker list.
const WITHIN: Duration = Duration::from_secs(2);

/// `(name, healthy, draining)` of each listed worker.
async fn workers(router: &str) -> Vec<(String, bool, bool)> {
    let w = get_json(&format!("{router}/admin/v1/workers")).await;
    w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                r["healthy"] == Value::Bool(true),
                r["draining"] == Value::Bool(true),
            )
        })
        .collect()
}

/// Waits (at most [`WITHIN`] from `since`) until the worker list satisfies `check`.
async fn shows(
    router: &str,
    since: Instant,
    what: &str,
    check: impl Fn(&[(String, bool, bool)]) -> bool,
) {
    let url = router.to_owned();
    let left = WITHIN.saturating_sub(since.elapsed());
    let check = &check;
    eventually(left, what, || {
        let url = url.clone();
        async move { check(&workers(&url).await) }
    })
    .await;
    eprintln!("{what}: shown after {:?}", since.elapsed());
}

fn has(ws: &[(String, bool, bool)], name: &str, healthy: bool, draining: bool) -> bool {
    ws.iter()
        .any(|(n, h, d)| n == name && *h == healthy && *d == draining)
}

fn absent(ws: &[(String, bool, bool)], name: &str) -> bool {
    ws.iter().all(|(n, ..)| n != name)
}

/// One step of `session`; the name of the worker that served it.
async fn step(router: &str, session: &str, text: &str) -> String {
    let resp = client()
        .post(format!("{router}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&chat_body(text, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{session}");
    resp.headers()["x-ownerserve-worker"]
        .to_str()
        .unwrap()
        .to_owned()
}

fn long(tag: &str) -> String {
    (0..60).map(|i| format!("{tag} word {i} ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_join_leave_and_hand_their_sessions_over() {
    let (fake, api) = FakeKube::start().await;
    let port = free_port().to_string();
    let ips = ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"];
    let _sims: Vec<Proc> = ips
        .iter()
        .map(|ip| Proc::sim_worker_on(&port, &["--host", ip, "--instant"]))
        .collect();
    fake.apply(FakePod::ready("a", ips[0]));
    fake.apply(FakePod::ready("b", ips[1]));
    let cfg = temp_config(
        "kubernetes.toml",
        &format!(
            "[router]\npolicy = \"ownerserve\"\ndirectory = \"embedded\"\nhealth_interval_ms = 200\n\
             worker_lease_ttl_ms = 1500\n\n\
             [kubernetes]\nselector = \"app=sim\"\nnamespace = \"test\"\ntarget_ports = [{port}]\n\
             api_server = \"{api}\"\ncoalesce_ms = 50\nresync_s = 60\n"
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let url = router.url.clone();
    let t = Instant::now();
    eventually(Duration::from_secs(10), "the listed pods joined", || {
        let url = url.clone();
        async move {
            let ws = workers(&url).await;
            has(&ws, "a", true, false) && has(&ws, "b", true, false)
        }
    })
    .await;
    eprintln!("initial list joined after {:?}", t.elapsed());

    // Added.
    let t = Instant::now();
    fake.apply(FakePod::ready("c", ips[2]));
    shows(&url, t, "pod c added", |ws| has(ws, "c", true, false)).await;

    // Turned not ready: drained (no new work), still listed.
    let t = Instant::now();
    fake.apply(FakePod {
        ready: false,
        ..FakePod::ready("b", ips[1])
    });
    shows(&url, t, "pod b not ready", |ws| {
        ws.iter().any(|(n, _, d)| n == "b" && *d)
    })
    .await;

    // Sessions on a and c; then the owner of the first is deleted.
    let sessions: Vec<String> = (0..6).map(|i| format!("k8s-s{i}")).collect();
    let mut served = Vec::new();
    for s in &sessions {
        served.push(step(&url, s, &long(s)).await);
    }
    assert!(served.iter().all(|w| w == "a" || w == "c"), "{served:?}");
    let n = sessions.len();
    eventually(Duration::from_secs(10), "sessions recorded", || {
        let url = url.clone();
        async move { common::session_owners(&url).await.len() == n }
    })
    .await;
    let before = common::session_owners(&url).await;
    let gone = served[0].clone();
    let t = Instant::now();
    fake.delete(&gone);
    shows(&url, t, "owner pod deleted", |ws| absent(ws, &gone)).await;
    for (s, first) in sessions.iter().zip(&served) {
        let now = step(&url, s, &format!("{} next", long(s))).await;
        assert_ne!(now, gone, "{s} went to its deleted pod");
        if *first == gone {
            assert_ne!(now, "b", "{s} went to a drained pod");
        }
    }
    let url2 = url.clone();
    let moved: Vec<String> = sessions
        .iter()
        .zip(&served)
        .filter(|(_, w)| **w == gone)
        .map(|(s, _)| s.clone())
        .collect();
    eventually(
        Duration::from_secs(10),
        "the deleted pod's sessions have new owners",
        || {
            let (url, before, moved) = (url2.clone(), before.clone(), moved.clone());
            async move {
                let after = common::session_owners(&url).await;
                moved
                    .iter()
                    .all(|s| after.get(s).is_some_and(|o| Some(o) != before.get(s)))
            }
        },
    )
    .await;

    // Behind a 410 Gone: c vanished and d appeared while no event said so.
    let lists = fake.lists();
    fake.silently(|pods| {
        pods.remove("c");
        pods.insert("d".into(), FakePod::ready("d", ips[3]));
    });
    let t = Instant::now();
    fake.expire();
    shows(&url, t, "re-listed after 410 Gone", |ws| {
        absent(ws, "c") && has(ws, "d", true, false)
    })
    .await;
    assert!(fake.lists() > lists, "the watcher re-listed");

    // A severed watch: the watcher watches again and misses nothing.
    eventually(Duration::from_secs(5), "watching again", || {
        let n = fake.watching();
        async move { n > 0 }
    })
    .await;
    fake.sever();
    let t = Instant::now();
    fake.apply(FakePod::ready("b", ips[1]));
    shows(&url, t, "pod b ready again after a severed watch", |ws| {
        has(ws, "b", true, false)
    })
    .await;
}
