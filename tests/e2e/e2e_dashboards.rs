//! The Grafana dashboards against a real Prometheus: `ownerserve up` and a standalone
//! directory node are scraped every second by a Prometheus server started here (the
//! Debian package, which `scripts/test` installs), traffic is driven through the router
//! (sessions, a fork, a drain, a stream, errors), and then every query of every panel of
//! every dashboard in `configs/grafana/dashboards/` must return data through Prometheus's
//! HTTP API. `promtool` checks our exposition and the shipped Prometheus config. Without
//! Prometheus the test fails: it is never skipped.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    chat_body, client, eventually, free_port, get_text, DirectoryNodes, Proc, ADMIN_TOKEN,
};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every dashboard, by file name.
fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("configs/grafana/dashboards");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let v = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `(dashboard, panel title, expr)` of every panel target.
fn queries() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (file, d) in dashboards() {
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                out.push((
                    file.clone(),
                    p["title"].as_str().unwrap().to_owned(),
                    t["expr"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    out
}

#[test]
fn dashboards_are_grafana_json_templated_on_datasource_and_instance() {
    let all = dashboards();
    let files: Vec<&str> = all.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        files,
        [
            "directory.json",
            "overview.json",
            "ownership.json",
            "workers.json"
        ]
    );
    let mut uids = std::collections::HashSet::new();
    for (file, d) in &all {
        assert!(d["schemaVersion"].as_u64().unwrap() >= 30, "{file}");
        assert!(
            uids.insert(d["uid"].as_str().unwrap().to_owned()),
            "{file}: uid"
        );
        assert!(
            d["title"].as_str().unwrap().starts_with("OwnerServe / "),
            "{file}"
        );
        let vars = d["templating"]["list"].as_array().unwrap();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name);
        let ds = var("datasource").unwrap_or_else(|| panic!("{file}: no datasource variable"));
        assert_eq!(
            (&ds["type"], &ds["query"]),
            (&json!("datasource"), &json!("prometheus"))
        );
        let inst = var("instance").unwrap_or_else(|| panic!("{file}: no instance variable"));
        assert_eq!(inst["type"], "query", "{file}");
        assert!(
            inst["query"]["query"]
                .as_str()
                .unwrap()
                .starts_with("label_values("),
            "{file}"
        );
        assert_eq!(inst["datasource"]["uid"], "${datasource}", "{file}");
        let panels = d["panels"].as_array().unwrap();
        assert!(panels.len() >= 8, "{file}: {} panels", panels.len());
        let mut ids = std::collections::HashSet::new();
        for p in panels {
            let title = p["title"].as_str().unwrap();
            assert!(ids.insert(p["id"].as_u64().unwrap()), "{file}: {title}: id");
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file}: {title}");
            assert!(p["gridPos"]["w"].as_u64().unwrap() <= 24, "{file}: {title}");
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{file}: {title}: no targets");
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(!expr.trim().is_empty(), "{file}: {title}: empty expr");
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file}: {title}");
                // A rate over a fixed window may hold fewer than two scrapes.
                assert!(
                    !expr.contains("rate(") || expr.contains("[$__rate_interval]"),
                    "{file}: {title}: rate() without $__rate_interval: {expr}"
                );
            }
        }
    }
    for f in [
        "configs/grafana/provisioning/datasources/ownerserve.yaml",
        "configs/grafana/provisioning/dashboards/ownerserve.yaml",
        "configs/prometheus/prometheus.yml",
    ] {
        assert!(repo().join(f).is_file(), "{f} is missing");
    }
}

/// A Prometheus tool from the Debian package; the test fails without it.
fn tool(name: &str) -> PathBuf {
    let dirs = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` not found: install Prometheus (`apt-get install prometheus`; scripts/test does)")
        })
}

/// `promtool <args>` with `stdin`; panics with its output unless it succeeds.
fn promtool(args: &[&str], stdin: &str) {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Prometheus server on a free port with its own data folder; killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(router: &str, directory: &str) -> Prometheus {
        let dir =
            std::env::temp_dir().join(format!("ownerserve-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let host = |url: &str| url.trim_start_matches("http://").to_owned();
        let rules = repo().join("configs/prometheus/alerts.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n\
             \x20 - job_name: ownerserve\n    static_configs:\n      - targets: ['{}']\n\
             \x20 - job_name: ownerserve-workers\n    http_sd_configs:\n      - url: {router}/metrics/targets\n        refresh_interval: 1s\n\
             \x20 - job_name: ownerserve-directory\n    static_configs:\n      - targets: ['{}']\n",
            rules.display(),
            host(router),
            host(directory),
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, &config).unwrap();
        promtool(&["check", "config", config_path.to_str().unwrap()], "");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// Waits until Prometheus answers queries: until then it serves a plain-text 503, not
    /// JSON, and on a loaded machine that can take seconds.
    async fn ready(&self) {
        let url = format!("{}/-/ready", self.url);
        eventually(Duration::from_secs(60), "Prometheus ready", || {
            let url = url.clone();
            async move {
                client()
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query (panics on an API error).
    async fn query(&self, expr: &str) -> Vec<Value> {
        let resp: Value = client()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(resp["status"], "success", "{expr}: {resp}");
        resp["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The first sample's value of an instant query, if any.
    async fn value(&self, expr: &str) -> Option<f64> {
        self.query(expr).await.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A panel's query as Grafana would send it: template variables match everything, the
/// interval macros become windows that hold several 1 s scrapes.
fn substitute(expr: &str) -> String {
    let mut out = expr
        .replace("$__rate_interval", "10s")
        .replace("${__rate_interval}", "10s")
        .replace("$__interval", "10s")
        .replace("${__interval}", "10s")
        .replace("$__range", "1h")
        .replace("${__range}", "1h");
    for var in ["datasource", "instance", "worker"] {
        out = out
            .replace(&format!("${{{var}}}"), ".*")
            .replace(&format!("${var}"), ".*");
    }
    assert!(!out.contains('$'), "unknown template variable in {expr}");
    out
}

async fn chat(
    router: &str,
    session: &str,
    turns: usize,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let context: String = (0..turns)
        .map(|i| format!("step {i}: read the file, run the tests, fix the failing case. "))
        .collect();
    let mut req = client()
        .post(format!("{router}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&chat_body(&context, 4));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// Waits until the directory records an owner for `session`.
async fn owner_recorded(router: &str, session: &str) {
    let url = format!("{router}/admin/v1/sessions/{session}");
    eventually(
        Duration::from_secs(10),
        "the session's owner recorded",
        || async {
            let Ok(r) = client().get(&url).bearer_auth(ADMIN_TOKEN).send().await else {
                return false;
            };
            r.status().is_success() && r.json::<Value>().await.is_ok_and(|v| !v["owner"].is_null())
        },
    )
    .await;
}

/// Sessions with several steps, a fork, a drain of the owner with a step after it, a
/// stream, and two refused requests.
async fn drive(router: &str) {
    for session in ["dash-a", "dash-b"] {
        for turn in 1..=4 {
            let r = chat(router, session, turn * 20, &[]).await;
            assert_eq!(r.status(), 200);
            // The ownership records committed, so the next step sees its owner.
            owner_recorded(router, session).await;
        }
    }
    let r = chat(
        router,
        "dash-a",
        81,
        &[("x-ownerserve-fork", "dash-a-fork")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = chat(router, "dash-b", 81, &[]).await;
    assert_eq!(r.status(), 200);
    let owner = r.headers()["x-ownerserve-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    owner_recorded(router, "dash-b").await;
    let drained = client()
        .post(format!("{router}/admin/v1/workers/{owner}/drain"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(drained.status(), 200);
    let r = chat(router, "dash-b", 82, &[]).await;
    assert_eq!(r.status(), 200);
    assert_ne!(r.headers()["x-ownerserve-worker"].to_str().unwrap(), owner);
    let mut stream = chat_body("stream me a few tokens", 8);
    stream["stream"] = json!(true);
    let r = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(&stream)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.text().await.unwrap();
    let mut unknown = chat_body("hi", 4);
    unknown["model"] = json!("no-such-model");
    let r = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(&unknown)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = client()
        .get(format!("{router}/admin/v1/workers"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let began = Instant::now();
    let up = Proc::up(&["--time-scale", "20"]);
    let nodes = DirectoryNodes::start(1, "dashboards", &[]);
    let directory = nodes.url(1);
    let router = up.url.clone();
    promtool(
        &[
            "check",
            "config",
            repo()
                .join("configs/prometheus/prometheus.yml")
                .to_str()
                .unwrap(),
        ],
        "",
    );
    let prom = Prometheus::start(&router, &directory);
    prom.ready().await;

    // Both expositions pass promtool's lint (names, units, _total counters, help texts).
    promtool(
        &["check", "metrics"],
        &get_text(&format!("{router}/metrics")).await,
    );
    promtool(
        &["check", "metrics"],
        &get_text(&format!("{directory}/metrics")).await,
    );

    // The router, its four workers (through /metrics/targets) and the directory node.
    eventually(
        Duration::from_secs(20),
        "every Prometheus target up",
        || async { prom.value("count(up == 1)").await == Some(6.0) },
    )
    .await;
    drive(&router).await;
    // The traffic is in Prometheus, and two more scrapes give every rate window two
    // samples after it.
    eventually(Duration::from_secs(15), "the traffic scraped", || async {
        let sessions = prom
            .value(r#"sum(ownerserve_session_steps_total{placement="owner"})"#)
            .await;
        let forks = prom
            .value(r#"max(ownerserve_directory_changes_total{change="fork"})"#)
            .await;
        sessions.is_some_and(|v| v >= 1.0) && forks.is_some_and(|v| v >= 1.0)
    })
    .await;
    // Two more scrapes of every target: each one's last scrape 2 s (two intervals) past the
    // newest scrape that saw the traffic.
    let seen = prom
        .value("max(timestamp(up))")
        .await
        .expect("scraped targets");
    eventually(Duration::from_secs(15), "two more scrapes", || async {
        prom.value("min(timestamp(up))")
            .await
            .is_some_and(|t| t >= seen + 2.0)
    })
    .await;

    let mut empty = Vec::new();
    let all = queries();
    for (file, title, expr) in &all {
        if prom.query(&substitute(expr)).await.is_empty() {
            empty.push(format!("{file} / {title}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "{} of {} panel queries returned no data:\n{}\nprometheus log:\n{}",
        empty.len(),
        all.len(),
        empty.join("\n"),
        prom.log()
    );
    // The shipped alert rules load and evaluate against the router's series.
    let rules = common::get_json(&format!("{}/api/v1/rules", prom.url)).await;
    let loaded: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert!(
        loaded
            .iter()
            .any(|r| r["name"] == "OwnerServeSilentCacheMiss" && r["health"] != "err"),
        "{rules}"
    );
    assert!(
        !prom
            .query("sum(ownerserve_cache_receipts_total{outcome=~\"kept|missed\"})")
            .await
            .is_empty(),
        "receipts checked against the engines' reports"
    );
    // Not just present: what the traffic did shows.
    for (expr, what) in [
        (
            r#"sum(ownerserve_http_requests_total{route="/v1/chat/completions",status="200"})"#,
            "chat requests",
        ),
        (
            r#"sum(ownerserve_http_requests_total{status=~"4.."})"#,
            "refused requests",
        ),
        (r#"sum(ownerserve_plans_total)"#, "plans"),
        (
            r#"sum(ownerserve_planner_decisions_total)"#,
            "planner decisions",
        ),
        (
            r#"max(ownerserve_directory_changes_total{change=~"session_move|prefix_migration"})"#,
            "owner moves",
        ),
        (
            r#"max(sum by (instance) (ownerserve_directory_sessions))"#,
            "sessions",
        ),
        (r#"sum(ownerserve_kv_events_total)"#, "KV events"),
        (
            r#"max(ownerserve_hbm_duplicate_factor)"#,
            "duplicate factor",
        ),
        (r#"sum(ownerserve_worker_draining)"#, "a draining worker"),
        (
            r#"sum(ownerserve_time_to_first_token_seconds_count)"#,
            "TTFT samples",
        ),
        (r#"max(ownerserve_raft_applied_index)"#, "applied entries"),
        (r#"sum(vllm:request_success_total)"#, "engine requests"),
    ] {
        let v = prom.value(expr).await.unwrap_or_default();
        assert!(v > 0.0, "{what}: {expr} = {v}");
    }
    drop(prom);
    drop(nodes);
    drop(up);
    eprintln!(
        "dashboards checked against Prometheus in {:?}",
        began.elapsed()
    );
}
