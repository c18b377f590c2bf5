//! Shared harness for the end-to-end tests: start real `ownerserve` processes on ephemeral
//! ports (`--port 0`), learn their address from the line they print, and kill them on drop.
#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(clippy::unwrap_used, reason = "test harness: a failure should panic")]

pub mod envoy;
pub mod epp;
pub mod fake_kube;
pub mod linearizable;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The admin token every process started by the harness gets.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The read-only token every process started by the harness gets.
pub const READ_TOKEN: &str = "test-read-token";
/// The cluster secret of the tests' directory clusters.
pub const CLUSTER_SECRET: &str = "test-cluster-secret-0123";

/// Default headers presenting [`CLUSTER_SECRET`] (to directory nodes; routers ignore it).
pub fn cluster_secret_headers() -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        ownerserve_ownership::node::secret::HEADER,
        reqwest::header::HeaderValue::from_static(CLUSTER_SECRET),
    );
    h
}

/// A running `ownerserve` child process.
pub struct Proc {
    pub child: Child,
    pub url: String,
    /// Lines printed up to and including the marker line.
    pub lines: Vec<String>,
    pub stdout: mpsc::Receiver<String>,
}

/// The `ownerserve` binary the tests run: this build's, or `OWNERSERVE_TEST_BIN` (a long
/// campaign, tests/faults/chaos.rs, runs a copy, so a rebuild meanwhile cannot swap it
/// under the runs).
pub fn ownerserve_exe() -> String {
    std::env::var("OWNERSERVE_TEST_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ownerserve").to_owned())
}

impl Proc {
    /// Runs `ownerserve <args>` and waits for the line `<marker> http://ADDR`.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)], marker: &str) -> Proc {
        Proc::spawn_exe(&ownerserve_exe(), args, envs, marker)
    }

    /// [`Proc::spawn`] of the `ownerserve` binary at `exe` (another release's, in
    /// upgrade tests).
    pub fn spawn_exe(exe: &str, args: &[&str], envs: &[(&str, &str)], marker: &str) -> Proc {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // openraft logs unreachable peers as errors; the fault tests make plenty.
            .env("OWNERSERVE_LOG", "warn,openraft=off")
            .env("OWNERSERVE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("OWNERSERVE_READ_TOKEN", READ_TOKEN);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn ownerserve");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{exe} {args:?} never printed `{marker}`");
            };
            lines.push(line.clone());
            if let Some(rest) = line.split(marker).nth(1) {
                let url = rest
                    .split_whitespace()
                    .next()
                    .expect("address after marker")
                    .to_owned();
                return Proc {
                    child,
                    url,
                    lines,
                    stdout: rx,
                };
            }
        }
    }

    /// `ownerserve up` with extra flags.
    pub fn up(extra: &[&str]) -> Proc {
        let mut args = vec!["up", "--port", "0"];
        args.extend_from_slice(extra);
        Proc::spawn(&args, &[], "ownerserve router listening on")
    }

    /// `ownerserve sim-worker` on a free port, with extra flags.
    pub fn sim_worker(extra: &[&str]) -> Proc {
        Proc::sim_worker_on("0", extra)
    }

    /// `ownerserve sim-worker` on `port`, with extra flags.
    pub fn sim_worker_on(port: &str, extra: &[&str]) -> Proc {
        let mut args = vec!["sim-worker", "--port", port];
        args.extend_from_slice(extra);
        Proc::spawn(&args, &[], "ownerserve sim worker listening on")
    }

    /// `ownerserve router` in front of `workers` (`URL,role=..`), with extra flags.
    pub fn router(workers: &[String], extra: &[&str]) -> Proc {
        let mut args: Vec<&str> = vec!["router", "--port", "0"];
        for w in workers {
            args.push("--worker");
            args.push(w);
        }
        args.extend_from_slice(extra);
        Proc::spawn(&args, &[], "ownerserve router listening on")
    }

    /// The word after `key` in the lines printed at start-up.
    pub fn printed(&self, key: &str) -> Option<String> {
        self.lines.iter().find_map(|l| {
            l.split(key)
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_owned)
        })
    }

    /// `sim-worker` publishing KV events on free ports: (worker, events, replay).
    pub fn sim_worker_with_events(extra: &[&str]) -> (Proc, String, String) {
        let mut args = vec![
            "--kv-events-endpoint",
            "tcp://127.0.0.1:0",
            "--kv-replay-endpoint",
            "tcp://127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let w = Proc::sim_worker(&args);
        let events = w.printed("kv events on ").expect("events endpoint");
        let replay = w.printed(" replay ").expect("replay endpoint");
        (w, events, replay)
    }

    /// Sends SIGINT, as Ctrl-C would.
    pub fn interrupt(&self) {
        self.signal("-INT");
    }

    /// Sends `signal` (`-STOP`, `-CONT`, `-INT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Kills the process at once (a crashed worker).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .default_headers(cluster_secret_headers())
        .build()
        .expect("client")
}

/// `n` distinct words `{seed}0 {seed}1 …`: a prompt of a known length whose content no
/// other seed shares.
pub fn words(seed: &str, n: usize) -> String {
    (0..n).map(|i| format!("{seed}{i} ")).collect()
}

/// The plan `router` would make for session `session`'s step with `body`
/// (`POST /admin/v1/plan/explain`, nothing sent to a worker).
pub async fn explain_session(
    router: &Proc,
    session: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let resp = client()
        .post(format!("{}/admin/v1/plan/explain", router.url))
        .bearer_auth(ADMIN_TOKEN)
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The cost term `term` (a key of the explain output's `cost`) of the colocation on worker
/// `id` in `plan`; NaN if there is none.
pub fn colocate_cost(plan: &serde_json::Value, id: u64, term: &str) -> f64 {
    plan["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["action"] == "colocate" && c["decode_on"] == id)
        .and_then(|c| c["cost"][term].as_f64())
        .unwrap_or(f64::NAN)
}

/// The plan `router` would make for a brand-new session's first step with `body`.
pub async fn explain_new_session(router: &Proc, body: &serde_json::Value) -> serde_json::Value {
    explain_session(router, "brand-new", body).await
}

/// `ownerserve router` with the `ownerserve` policy and an embedded directory in front of
/// the sim `workers`, named `w0`, `w1`, … in the roles of `roles` (in order), scraping their
/// metrics every 100 ms; `extra` adds `[router]` keys.
pub fn planner_router(name: &str, workers: &[Proc], roles: &[&str], extra: &str) -> Proc {
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    planner_router_at(name, &urls, roles, extra)
}

/// [`planner_router`] over the workers at `urls`.
pub fn planner_router_at(name: &str, urls: &[&str], roles: &[&str], extra: &str) -> Proc {
    let mut cfg = format!(
        "[router]\npolicy = \"ownerserve\"\ndirectory = \"embedded\"\nscrape_interval_ms = 100\n{extra}"
    );
    for (i, (url, role)) in urls.iter().zip(roles).enumerate() {
        cfg.push_str(&format!(
            "\n[[workers]]\nname = \"w{i}\"\nurl = \"{url}\"\nrole = \"{role}\"\nengine = \"sim\"\n"
        ));
    }
    Proc::router(&[], &["--config", &temp_config(name, &cfg)])
}

/// `body` streamed through `router` as a step of `session`: checks it is answered 200 and
/// ends with `[DONE]`, and returns the worker that served it (`x-ownerserve-worker`).
pub async fn stream_step(router: &Proc, session: &str, body: &serde_json::Value) -> String {
    let mut body = body.clone();
    body["stream"] = serde_json::json!(true);
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let worker = resp.headers()["x-ownerserve-worker"]
        .to_str()
        .unwrap()
        .to_owned();
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    worker
}

/// A long stream sent straight to `worker` (no router), held open in a task of `loads`:
/// load that routers see only through their scrapes of the worker's metrics.
pub fn hold_stream(loads: &mut tokio::task::JoinSet<()>, worker: &Proc, prompt: String) {
    let url = format!("{}/v1/chat/completions", worker.url);
    loads.spawn(async move {
        let mut body = chat_body(&prompt, 400);
        body["stream"] = serde_json::json!(true);
        if let Ok(mut resp) = client().post(url).json(&body).send().await {
            while let Ok(Some(_)) = resp.chunk().await {}
        }
    });
}

pub fn chat_body(content: &str, max_tokens: u32) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
}

/// `body` posted to `router`'s chat completions as a stream; the response once its first
/// chunk arrived, and that chunk.
pub async fn first_chunk(
    router: &str,
    mut body: serde_json::Value,
) -> (reqwest::Response, Vec<u8>) {
    body["stream"] = serde_json::json!(true);
    let mut resp = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    (resp, first.to_vec())
}

/// Polls `check` every 50 ms until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Reads one Prometheus sample (`name{labels} value`) whose line starts with `prefix`.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {prefix} in\n{text}"))
}

/// An address nothing listens on.
pub fn dead_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

/// GETs `url` (with the admin token) and parses the body as JSON.
pub async fn get_json(url: &str) -> serde_json::Value {
    client()
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The directory's owner (worker id) of every session, as the router at `api` lists them.
pub async fn session_owners(api: &str) -> std::collections::BTreeMap<String, u64> {
    let s = get_json(&format!("{api}/admin/v1/sessions")).await;
    s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r["owner"]["worker"].as_u64()?)))
        .collect()
}

/// GETs `url` (with the admin token: routers keep `/metrics` behind it) as text.
pub async fn get_text(url: &str) -> String {
    client()
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Writes `text` to a file named `name` in a per-process temp folder; returns its path.
pub fn temp_config(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("ownerserve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A free TCP port on 127.0.0.1 (for processes whose port must be known before they start).
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), where nothing else
/// the tests run lands: every other process binds port 0 and every outgoing connection
/// takes its local port from that range, so neither can take this port between the probe
/// and the process binding it (an ephemeral probe could be handed out again to a process
/// another test started, and the node meant for it exited with "address in use").
pub fn free_port() -> u16 {
    // A port is never handed out twice by this process: a cluster given one port for two
    // nodes never starts.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let (low, high) = (16_384u32, u32::from(ephemeral_start()).max(16_384 + 1024));
    let span = high - low;
    // Each test process starts at its own place in the range, so two test binaries
    // running at once rarely probe the same ports.
    let start = std::process::id().wrapping_mul(7_919) % span;
    (0..span)
        .map(|i| (low + (start + i) % span) as u16)
        .find(|p| !given.contains(p) && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .inspect(|p| given.push(*p))
        .expect("a free port below the ephemeral range")
}

/// The first port of the kernel's ephemeral range (Linux's default 32768 when unknown).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `n` `ownerserve directory` processes forming one cluster on 127.0.0.1, numbered from 1
/// (their Raft ids); node 1 initialises it. Each can be killed and restarted on its data,
/// by this build's binary or another release's.
pub struct DirectoryNodes {
    ports: Vec<u16>,
    base: std::path::PathBuf,
    extra: Vec<String>,
    procs: Vec<Option<Proc>>,
    /// How the nodes name each other in `--peer` (an IP address, or a DNS name).
    peer_host: String,
    /// The binary each node runs ([`ownerserve_exe`] unless set).
    exes: Vec<String>,
}

impl DirectoryNodes {
    /// Starts the nodes with `extra` flags each; `tag` names their data folder.
    pub fn start(n: usize, tag: &str, extra: &[&str]) -> DirectoryNodes {
        DirectoryNodes::start_naming_peers(n, tag, extra, "127.0.0.1")
    }

    /// Starts the nodes naming each other `peer_host:PORT` (a DNS name such as
    /// `localhost`, as a StatefulSet's pods name theirs).
    pub fn start_naming_peers(
        n: usize,
        tag: &str,
        extra: &[&str],
        peer_host: &str,
    ) -> DirectoryNodes {
        let mut nodes = DirectoryNodes::planned(n, tag, extra, peer_host);
        nodes.start_all();
        nodes
    }

    /// The nodes' ports and (empty) data folders, none started yet: their data can be
    /// prepared first (a restore), then [`DirectoryNodes::start_all`].
    pub fn planned(n: usize, tag: &str, extra: &[&str], peer_host: &str) -> DirectoryNodes {
        let base =
            std::env::temp_dir().join(format!("ownerserve-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        DirectoryNodes {
            ports: (0..n).map(|_| free_port()).collect(),
            base,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            procs: (0..n).map(|_| None).collect(),
            peer_host: peer_host.to_owned(),
            exes: (0..n).map(|_| ownerserve_exe()).collect(),
        }
    }

    /// Starts every node that does not run.
    pub fn start_all(&mut self) {
        for i in 1..=self.len() {
            if !self.running(i) {
                self.restart(i);
            }
        }
    }

    /// Node `i`'s data folder.
    pub fn data_dir(&self, i: usize) -> std::path::PathBuf {
        self.base.join(format!("node{i}"))
    }

    /// The nodes' `--peer` values (`ID=HOST:PORT`).
    pub fn peers(&self) -> Vec<String> {
        self.ports
            .iter()
            .enumerate()
            .map(|(j, p)| format!("{}={}:{p}", j + 1, self.peer_host))
            .collect()
    }

    fn spawn(&self, i: usize) -> Proc {
        let (id, listen) = (i.to_string(), format!("127.0.0.1:{}", self.ports[i - 1]));
        let data = self.data_dir(i);
        let peers = self.peers();
        let mut args = vec![
            "directory",
            "--id",
            &id,
            "--listen",
            &listen,
            "--data-dir",
            data.to_str().unwrap(),
            "--cluster-secret",
            CLUSTER_SECRET,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        for p in &peers {
            args.push("--peer");
            args.push(p);
        }
        if i == 1 {
            args.push("--init");
        }
        Proc::spawn_exe(&self.exes[i - 1], &args, &[], "listening on")
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i - 1])
    }

    pub fn urls(&self) -> Vec<String> {
        (1..=self.len()).map(|i| self.url(i)).collect()
    }

    /// kill -9 node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i - 1].take() {
            p.kill();
        }
    }

    /// Starts node `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        let p = self.spawn(i);
        self.procs[i - 1] = Some(p);
    }

    /// Node `i` runs the binary at `exe` from its next start on (another release's).
    pub fn run_exe(&mut self, i: usize, exe: &str) {
        self.exes[i - 1] = exe.to_owned();
    }

    /// Stops node `i` as an operator would: SIGTERM, and SIGKILL if it has not exited
    /// within `grace`. How long it took, and whether it had to be killed.
    pub fn stop(&mut self, i: usize, grace: Duration) -> (Duration, bool) {
        let Some(mut p) = self.procs[i - 1].take() else {
            return (Duration::ZERO, false);
        };
        let asked = Instant::now();
        p.signal("-TERM");
        while asked.elapsed() < grace {
            if matches!(p.child.try_wait(), Ok(Some(_))) {
                return (asked.elapsed(), false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        p.kill();
        (asked.elapsed(), true)
    }

    /// Node `i`'s process, if it runs.
    pub fn proc(&self, i: usize) -> Option<&Proc> {
        self.procs.get(i - 1).and_then(Option::as_ref)
    }

    /// Whether node `i` (1-based) exists and runs.
    pub fn running(&self, i: usize) -> bool {
        i >= 1 && self.procs.get(i - 1).is_some_and(Option::is_some)
    }

    /// The folder holding every node's data folder.
    pub fn data_root(&self) -> &std::path::Path {
        &self.base
    }
}

/// `n` sim workers started with `flags`, each on a port of its own, and the
/// `[[workers]]` TOML naming them `w0`, `w1`, … (hybrid, engine `sim`).
pub fn sim_worker_fleet(n: usize, flags: &[&str]) -> (Vec<Proc>, Vec<u16>, String) {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let workers = ports
        .iter()
        .map(|p| Proc::sim_worker_on(&p.to_string(), flags))
        .collect();
    let toml = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!("[[workers]]\nname = \"w{i}\"\nurl = \"http://127.0.0.1:{p}\"\nrole = \"hybrid\"\nengine = \"sim\"\n\n")
        })
        .collect();
    (workers, ports, toml)
}

/// The `[router]` keys of a router of the remote directory cluster `nodes`.
pub fn remote_directory_keys(nodes: &DirectoryNodes) -> String {
    let urls: Vec<String> = nodes.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "directory = \"remote\"\ndirectory_urls = [{}]\ndirectory_secret = \"{CLUSTER_SECRET}\"\n",
        urls.join(", ")
    )
}
