//! Tenants' budgets held across router replicas: a 3-node `ownerserve directory` cluster,
//! two `ownerserve router`s (directory `remote`) and two instant sim workers. Tenant
//! `acme` may be admitted N tokens a minute and `beta` two live sessions, fleet-wide:
//! clients of `acme` hammer both routers for a minute and the fleet admits at most 1.1 N
//! (each router alone would admit N); `beta`'s third session is refused whichever router
//! it comes through, and a session the client closes gives its place back.
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{self, client, temp_config, DirectoryNodes, Proc};

/// `acme`'s tokens a minute.
const N: u64 = 30_000;

struct Stack {
    _nodes: DirectoryNodes,
    _workers: Vec<Proc>,
    routers: Vec<Proc>,
}

fn start() -> Stack {
    let nodes = DirectoryNodes::start(3, "tenants", &["--tick-ms", "200"]);
    let (workers, _, workers_toml) = common::sim_worker_fleet(2, &["--instant"]);
    let config = temp_config(
        "tenant-budgets.toml",
        &format!(
            "[router]\nport = 0\npolicy = \"round_robin\"\n{}\n\
             [router.tenants.acme]\nkeys = [\"acme-key-0001\"]\ntokens_per_minute = {N}\n\n\
             [router.tenants.beta]\nkeys = [\"beta-key-0001\"]\nmax_sessions = 2\n\n\
             {workers_toml}",
            common::remote_directory_keys(&nodes)
        ),
    );
    let routers = (0..2)
        .map(|_| {
            Proc::spawn(
                &["router", "--config", &config],
                &[],
                "ownerserve router listening on",
            )
        })
        .collect();
    Stack {
        _nodes: nodes,
        _workers: workers,
        routers,
    }
}

async fn send(router: &str, key: &str, session: &str) -> u16 {
    let body = json!({
        "model": common::MODEL,
        "messages": [{"role": "user", "content": "count to three"}],
        "max_tokens": 50,
    });
    client()
        .post(format!("{router}/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

/// `ownerserve_tenant_tokens_total{tenant}` on `router`.
async fn tokens_admitted(router: &str, tenant: &str) -> u64 {
    let text = common::get_text(&format!("{router}/metrics")).await;
    common::metric(
        &text,
        &format!("ownerserve_tenant_tokens_total{{tenant=\"{tenant}\"}} "),
    ) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_budgets_hold_across_two_routers() {
    let stack = start();
    let (a, b) = (stack.routers[0].url.clone(), stack.routers[1].url.clone());
    // Both routers serve once their replicas have synced.
    for r in [&a, &b] {
        common::eventually(Duration::from_secs(30), "the router serves", || {
            let r = r.clone();
            async move { send(&r, "beta-key-0001", "warm").await == 200 }
        })
        .await;
    }

    // beta: two live sessions fleet-wide ("warm" holds one), whichever router they use.
    assert_eq!(send(&b, "beta-key-0001", "s1").await, 200);
    assert_eq!(send(&a, "beta-key-0001", "s2").await, 429, "third session");
    assert_eq!(send(&b, "beta-key-0001", "s3").await, 429, "third session");
    assert_eq!(
        send(&a, "beta-key-0001", "s1").await,
        200,
        "a live one goes on"
    );
    assert_eq!(send(&b, "beta-key-0001", "warm").await, 200);
    let refused: Value = client()
        .post(format!("{a}/v1/chat/completions"))
        .bearer_auth("beta-key-0001")
        .header("x-session-id", "s4")
        .json(&json!({"model": common::MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused["error"]["code"], "too_many_sessions");
    // A session the client closes gives its place back at once, through either router.
    let closed = client()
        .post(format!("{b}/v1/chat/completions"))
        .bearer_auth("beta-key-0001")
        .header("x-session-id", "s1")
        .header("x-ownerserve-session-control", "close")
        .json(&json!({"model": common::MODEL, "messages": [{"role": "user", "content": "bye"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    assert_eq!(send(&a, "beta-key-0001", "s4").await, 200, "s1's place");
    assert_eq!(send(&b, "beta-key-0001", "s5").await, 429, "full again");

    // acme: four clients per router, for a minute, each as fast as it is answered (a
    // refused one waits 100 ms).
    let started = Instant::now();
    let minute = Duration::from_secs(60);
    let tasks = tokio_util::task::TaskTracker::new();
    for i in 0..8 {
        let router = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move {
            let mut n = 0;
            while started.elapsed() < minute {
                n += 1;
                if send(&router, "acme-key-0001", &format!("acme-{i}-{n}")).await != 200 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }
    tasks.close();
    tasks.wait().await;
    let (on_a, on_b) = (
        tokens_admitted(&a, "acme").await,
        tokens_admitted(&b, "acme").await,
    );
    let fleet = on_a + on_b;
    eprintln!("acme admitted in a minute: {on_a} + {on_b} = {fleet} tokens of {N}");
    assert!(fleet as f64 <= 1.1 * N as f64, "{fleet} > 1.1 × {N}");
    assert!(
        fleet as f64 >= 0.8 * N as f64,
        "{fleet}: the budget is given out"
    );
    // Each router admitted a share: neither was starved by the other's leases.
    assert!(on_a as f64 >= 0.25 * N as f64 && on_b as f64 >= 0.25 * N as f64);
}
