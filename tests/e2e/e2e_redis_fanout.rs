//! Two router replicas fed through a real Redis Stream build identical KV indexes.
//! Needs `redis-server` on the PATH (`scripts/test` installs it).

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{chat_body, client, eventually, get_json, temp_config, Proc};
use serde_json::Value;

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Redis, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test installs it)");
    let redis = Redis(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (redis, port);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis-server did not start");
}

fn router_config(
    name: &str,
    redis: u16,
    role: &str,
    workers: &[(&str, &str, &str, &str)],
) -> String {
    let mut text = format!(
        "[router]\nkv_redis_url = \"redis://127.0.0.1:{redis}\"\nkv_redis_role = \"{role}\"\n\
         kv_redis_stream_prefix = \"test:{}\"\n",
        std::process::id()
    );
    for (wname, url, events, replay) in workers {
        text.push_str(&format!(
            "\n[[workers]]\nname = \"{wname}\"\nurl = \"{url}\"\nrole = \"decode\"\nengine = \"sim\"\n\
             kv_events = \"{events}\"\nkv_replay = \"{replay}\"\n"
        ));
    }
    temp_config(&format!("{name}.toml"), &text)
}

async fn kv(router: &str) -> Value {
    get_json(&format!("{router}/admin/v1/kv")).await
}

#[tokio::test]
async fn two_replicas_fed_through_redis_streams_hold_identical_indexes() {
    let (_redis, port) = start_redis();
    let (a, a_events, a_replay) = Proc::sim_worker_with_events(&["--instant"]);
    let (b, b_events, b_replay) =
        Proc::sim_worker_with_events(&["--instant", "--max-kv-blocks", "200"]);
    let workers = [
        ("a", a.url.as_str(), a_events.as_str(), a_replay.as_str()),
        ("b", b.url.as_str(), b_events.as_str(), b_replay.as_str()),
    ];
    let publisher = Proc::router(
        &[],
        &["--config", &router_config("pub", port, "publish", &workers)],
    );
    let consumer = Proc::router(
        &[],
        &["--config", &router_config("con", port, "consume", &workers)],
    );

    // Traffic through the publishing replica; worker b's small cache also evicts (removals).
    for i in 0..12 {
        let text: String = (0..150).map(|w| format!("doc{i} w{w} ")).collect();
        let resp = client()
            .post(format!("{}/v1/chat/completions", publisher.url))
            .json(&chat_body(&text, 2))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let (p, c) = (publisher.url.clone(), consumer.url.clone());
    eventually(
        Duration::from_secs(15),
        "identical indexes on both replicas",
        || {
            let (p, c) = (p.clone(), c.clone());
            async move {
                let (kp, kc) = (kv(&p).await, kv(&c).await);
                // Removals too: the indexes can match for a moment before b's evictions
                // are published.
                kp["blocks"].as_u64().unwrap_or(0) > 100
                    && kp["stats"]["blocks_removed"].as_u64().unwrap_or(0) > 0
                    && kp["digest"] == kc["digest"]
                    && kp["blocks"] == kc["blocks"]
            }
        },
    )
    .await;
    let (kp, kc) = (kv(&publisher.url).await, kv(&consumer.url).await);
    assert!(
        kp["stats"]["blocks_removed"].as_u64().unwrap() > 0,
        "evictions travelled too: {kp}"
    );
    // Only the publisher talks ZMQ; the consumer built its index from Redis alone.
    let batches = |k: &Value| -> u64 {
        k["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["events"]["batches"].as_u64().unwrap_or(0))
            .sum()
    };
    assert!(batches(&kp) > 0);
    assert_eq!(batches(&kc), 0);
}
