//! Chaos: randomized runs of the whole production topology under process faults, each
//! with a recorded client history checked afterwards.
//!
//! One run: a 3-node `ownerserve directory` cluster, two simulated engines (real time) and an
//! `ownerserve router` (policy `ownerserve`, directory `remote`) in front of them, every
//! one a separate process. For a few seconds, clients work on it while a fault driver hits a
//! random process every ~0.5–1 s with kill -9 (then a restart on the same port and data) or
//! SIGSTOP (then SIGCONT); at most one directory node is down at a time, so a quorum
//! exists throughout. Then everything is healed and the run is checked:
//! - **no acknowledged directory write lost, no two owners at once, no stale-epoch request
//!   accepted**: directory clients claim, release (sometimes with a stale epoch on
//!   purpose) and read keys; each key's history must be linearizable against the
//!   sequential model of `common::linearizable` (a lost acknowledged claim, two owners or
//!   an accepted stale release each make it non-linearizable), and the final state of the
//!   directory must satisfy the state machine's invariants (one owner per key and session,
//!   every owner backed by its lease);
//! - **every client request answered within its deadline**: router clients (sessions,
//!   streamed or not) must each get, within 20 s, a complete answer or a clean error (an
//!   OpenAI-shaped JSON error, or an SSE error event and `[DONE]`); only a request in
//!   flight while the router itself was killed may see its connection cut.
//!
//! `OWNERSERVE_CHAOS_RUNS` (default 2, what CI runs), `OWNERSERVE_CHAOS_SEED` (first seed,
//! default 1) and `OWNERSERVE_CHAOS_PARALLEL` (runs at once, default 1) set the campaign;
//! it prints one line per run and the totals, and fails on any violation. A restart runs the
//! binary again: for a long campaign, point `OWNERSERVE_TEST_BIN` at a copy, so a rebuild
//! meanwhile cannot swap it (docs/OPERATING.md, "Hardening", has the command).

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]
#![allow(clippy::print_stdout, reason = "the campaign's report")]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::linearizable::*;
use common::{free_port, temp_config, DirectoryNodes, Proc, CLUSTER_SECRET};
use serde_json::{json, Value};

/// Keys the directory clients contend on.
const KEYS: u64 = 3;
/// How long the clients work while faults are injected.
const FAULT_PHASE: Duration = Duration::from_secs(4);
/// A router client's deadline for one request.
const CLIENT_DEADLINE: Duration = Duration::from_secs(20);

/// A tiny deterministic PRNG for the fault schedule and the clients' choices.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Which process a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Node(usize),
    Worker(usize),
    Router,
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// kill -9, then a restart after the pause.
    Kill,
    /// SIGSTOP, then SIGCONT after the pause.
    Stop,
}

/// The processes of one run.
struct Topology {
    nodes: DirectoryNodes,
    workers: Vec<Option<Proc>>,
    worker_ports: Vec<u16>,
    router: Option<Proc>,
    router_config: String,
}

impl Topology {
    fn start(tag: &str) -> Topology {
        let nodes = DirectoryNodes::start(3, tag, &["--tick-ms", "500"]);
        let worker_ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
        let workers = worker_ports
            .iter()
            .map(|p| Some(Proc::sim_worker_on(&p.to_string(), &[])))
            .collect();
        let urls: Vec<String> = nodes.urls().iter().map(|u| format!("\"{u}\"")).collect();
        let workers_toml: String = worker_ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!("[[workers]]\nname = \"w{i}\"\nurl = \"http://127.0.0.1:{p}\"\nrole = \"hybrid\"\n\n")
            })
            .collect();
        let router_config = temp_config(
            &format!("chaos-{tag}.toml"),
            &format!(
                "[router]\nport = {}\npolicy = \"ownerserve\"\ndirectory = \"remote\"\n\
                 directory_urls = [{}]\ndirectory_secret = \"{CLUSTER_SECRET}\"\n\
                 health_interval_ms = 200\nhealth_timeout_ms = 500\nrequest_timeout_s = 5\n\
                 stream_idle_timeout_s = 2\nconnect_timeout_ms = 300\n\n{workers_toml}",
                free_port(),
                urls.join(", ")
            ),
        );
        let router = Some(Proc::spawn(
            &["router", "--config", &router_config],
            &[],
            "ownerserve router listening on",
        ));
        Topology {
            nodes,
            workers,
            worker_ports,
            router,
            router_config,
        }
    }

    fn router_url(&self) -> String {
        self.router
            .as_ref()
            .map(|r| r.url.clone())
            .unwrap_or_default()
    }

    fn proc_of(&self, v: Victim) -> Option<&Proc> {
        match v {
            Victim::Node(i) => self.nodes.proc(i),
            Victim::Worker(i) => self.workers[i].as_ref(),
            Victim::Router => self.router.as_ref(),
        }
    }

    fn kill(&mut self, v: Victim) {
        match v {
            Victim::Node(i) => self.nodes.kill(i),
            Victim::Worker(i) => drop(self.workers[i].take()),
            Victim::Router => drop(self.router.take()),
        }
    }

    fn restart(&mut self, v: Victim) {
        match v {
            Victim::Node(i) => self.nodes.restart(i),
            Victim::Worker(i) => {
                let port = self.worker_ports[i].to_string();
                self.workers[i] = Some(Proc::sim_worker_on(&port, &[]));
            }
            Victim::Router => {
                self.router = Some(Proc::spawn(
                    &["router", "--config", &self.router_config],
                    &[],
                    "ownerserve router listening on",
                ));
            }
        }
    }
}

/// How a router client's request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// A complete answer (a JSON completion, or a stream ending in `[DONE]`).
    Complete,
    /// A clean error: an OpenAI-shaped JSON error, or an SSE error event and `[DONE]`.
    CleanError(u16),
    /// The connection failed or broke (only allowed around a router kill).
    Cut(String),
    /// Nothing within the deadline: a violation.
    Silent,
    /// An answer that is neither complete nor a clean error: a violation.
    Garbled(String),
}

/// One router request: a session step, streamed or not.
async fn ask(http: &reqwest::Client, url: &str, session: &str, stream: bool) -> Answer {
    let body = json!({
        "model": common::MODEL,
        "messages": [{"role": "user", "content": format!("{session}: go on with the task")}],
        "max_tokens": 24,
        "stream": stream,
    });
    let asked = async {
        let resp = http
            .post(format!("{url}/v1/chat/completions"))
            .header("x-session-id", session)
            .json(&body)
            .send()
            .await
            .map_err(|e| Answer::Cut(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| Answer::Cut(e.to_string()))?;
        Ok::<_, Answer>((status, text))
    };
    let (status, text) = match tokio::time::timeout(CLIENT_DEADLINE, asked).await {
        Err(_) => return Answer::Silent,
        Ok(Err(a)) => return a,
        Ok(Ok(r)) => r,
    };
    let json_error = || {
        serde_json::from_str::<Value>(&text)
            .is_ok_and(|v| v["error"]["message"].is_string() && v["error"]["type"].is_string())
    };
    match (status, stream) {
        (200, true) if text.trim_end().ends_with("data: [DONE]") => {
            if text.contains("\"error\"") {
                Answer::CleanError(200)
            } else {
                Answer::Complete
            }
        }
        (200, false)
            if serde_json::from_str::<Value>(&text).is_ok_and(|v| v["choices"].is_array()) =>
        {
            Answer::Complete
        }
        (400..=599, _) if json_error() => Answer::CleanError(status),
        _ => Answer::Garbled(format!(
            "{status}: {}",
            text.chars().take(300).collect::<String>()
        )),
    }
}

/// What one run saw.
#[derive(Debug, Default)]
struct RunReport {
    faults: Vec<(Victim, Fault)>,
    directory_ops: usize,
    directory_unanswered: usize,
    requests: usize,
    complete: usize,
    clean_errors: usize,
    cut: usize,
    violations: Vec<String>,
}

/// A run: the topology, the clients, the faults, the checks.
fn one_run(seed: u64) -> RunReport {
    let tag = format!("chaos{seed}");
    let mut topo = Topology::start(&tag);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let urls = topo.nodes.urls();
    let c = http();
    let mut report = RunReport::default();
    // A lease per directory client, granted before the faults.
    let leases: Vec<u64> = runtime.block_on(async {
        let mut leases = Vec::new();
        for w in 0..2u64 {
            let out = write(
                &c,
                &urls,
                100,
                w + 1,
                json!({"GrantLease": {"worker": w, "ttl_ms": 600_000}}),
            )
            .await
            .expect("a lease before any fault");
            leases.push(out["LeaseGranted"]["lease"].as_u64().unwrap());
        }
        leases
    });
    let origin = Instant::now();
    let history = Arc::new(Mutex::new(Vec::<Event>::new()));
    let answers = Arc::new(Mutex::new(Vec::<(Duration, Duration, Answer)>::new()));
    let router_url = topo.router_url();
    let mut clients = tokio::task::JoinSet::new();
    {
        let _entered = runtime.enter();
        for (n, &lease) in leases.iter().enumerate() {
            let (urls, history) = (urls.clone(), history.clone());
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | (1 + n as u64));
            clients.spawn(directory_client(
                n,
                lease,
                urls,
                history,
                origin,
                rng.next() | 1,
            ));
        }
        for n in 0..3 {
            let (url, answers) = (router_url.clone(), answers.clone());
            let session = format!("chaos-{seed}-{n}");
            clients.spawn(router_client(url, session, answers, origin, n % 2 == 0));
        }
    }
    // Faults, from this thread, while the runtime runs the clients.
    let mut rng = Rng(seed.wrapping_mul(6_364_136_223_846_793_005) | 1);
    let mut router_kills: Vec<(Duration, Duration)> = Vec::new();
    while origin.elapsed() < FAULT_PHASE {
        // The fault schedule (what the run is about): a fault every 0.3–0.8 s, each lasting
        // `pause`.
        std::thread::sleep(Duration::from_millis(300 + rng.below(500)));
        let victim = match rng.below(6) {
            0..=2 => Victim::Node(1 + rng.below(3) as usize),
            3 | 4 => Victim::Worker(rng.below(2) as usize),
            _ => Victim::Router,
        };
        let fault = if rng.below(2) == 0 {
            Fault::Kill
        } else {
            Fault::Stop
        };
        let pause = Duration::from_millis(200 + rng.below(1000));
        let started = origin.elapsed();
        match fault {
            Fault::Kill => {
                topo.kill(victim);
                std::thread::sleep(pause);
                topo.restart(victim);
            }
            Fault::Stop => {
                let Some(p) = topo.proc_of(victim) else {
                    continue;
                };
                p.signal("-STOP");
                std::thread::sleep(pause);
                p.signal("-CONT");
            }
        }
        if victim == Victim::Router && fault == Fault::Kill {
            router_kills.push((started, origin.elapsed()));
        }
        report.faults.push((victim, fault));
    }
    let stop_at = origin.elapsed();
    runtime.block_on(async {
        while let Some(r) = clients.join_next().await {
            r.unwrap();
        }
    });
    // Healed: every key read once more (linearizably), and the state checked.
    let final_state = runtime.block_on(async {
        for key in 1..=KEYS {
            let invoke = origin.elapsed();
            let ret = read_within(&c, &urls, key, Duration::from_secs(20)).await;
            history.lock().unwrap().push(Event {
                client: 99,
                key,
                op: Op::Read,
                ret: ret.map(|r| (r, origin.elapsed())),
                invoke,
            });
        }
        common::linearizable::directory_state(&c, &urls).await
    });
    let history = history.lock().unwrap().clone();
    report.directory_ops = history.len();
    report.directory_unanswered = history.iter().filter(|e| e.ret.is_none()).count();
    check_history(&history, &mut report.violations);
    match final_state {
        Some(state) => {
            for v in ownerserve_ownership::invariants::check(&state) {
                report
                    .violations
                    .push(format!("directory invariant: {v:?}"));
            }
        }
        None => report
            .violations
            .push("the healed directory answered no state read".into()),
    }
    let answers = answers.lock().unwrap().clone();
    report.requests = answers.len();
    for (sent, done, a) in &answers {
        match a {
            Answer::Complete => report.complete += 1,
            Answer::CleanError(_) => report.clean_errors += 1,
            Answer::Cut(why) => {
                report.cut += 1;
                // Allowed only if the router was killed while the request was in flight.
                let excused = router_kills
                    .iter()
                    .any(|(from, to)| *sent <= *to && *done >= *from);
                if !excused {
                    report.violations.push(format!(
                        "request sent at {sent:?} cut at {done:?} with no router kill: {why}"
                    ));
                }
            }
            Answer::Silent => report.violations.push(format!(
                "request sent at {sent:?} got no answer within {CLIENT_DEADLINE:?}"
            )),
            Answer::Garbled(what) => report.violations.push(format!(
                "request sent at {sent:?} got a garbled answer: {what}"
            )),
        }
    }
    if report.requests == 0 || report.directory_ops < 5 {
        report.violations.push(format!(
            "too little traffic to judge: {} requests, {} directory ops (fault phase ended at {stop_at:?})",
            report.requests, report.directory_ops
        ));
    }
    let _ = std::fs::remove_dir_all(topo.nodes.data_root());
    report
}

/// Each key's history must be linearizable (checked on a thread with room for the search).
fn check_history(history: &[Event], violations: &mut Vec<String>) {
    let history = history.to_vec();
    let checker = std::thread::Builder::new().stack_size(256 << 20);
    let found = checker
        .spawn(move || {
            let mut found = Vec::new();
            for key in 1..=KEYS {
                let h: Vec<Event> = history.iter().filter(|e| e.key == key).cloned().collect();
                if !linearizable(&h) {
                    found.push(format!("key {key} is not linearizable:\n{h:#?}"));
                }
            }
            found
        })
        .unwrap()
        .join()
        .unwrap();
    violations.extend(found);
}

/// Claims, releases (a stale epoch now and then, on purpose) and reads until the fault
/// phase ends, each recorded.
async fn directory_client(
    n: usize,
    lease: u64,
    urls: Vec<String>,
    history: Arc<Mutex<Vec<Event>>>,
    origin: Instant,
    seed: u64,
) {
    let c = http();
    let mut rng = Rng(seed);
    let mut known = [0u64; KEYS as usize + 1];
    let mut seq = 0;
    let within = Duration::from_secs(15);
    while origin.elapsed() < FAULT_PHASE {
        let key = 1 + rng.below(KEYS);
        let invoke = origin.elapsed();
        let (op, ret) = match rng.below(4) {
            0 | 1 => {
                seq += 1;
                let cmd = json!({"Claim": {"key": key, "lease": lease, "spec": {"parent": null, "blocks": [0, 1], "kv_type": "t", "size_bytes": 1}, "expect_epoch": null}});
                let ret = write_within(&c, &urls, (n as u64, seq), cmd, within)
                    .await
                    .map(|out| ret_of(&out));
                if let Some(Ret::Owned(e)) = ret {
                    known[key as usize] = e;
                }
                (Op::Claim { lease }, ret)
            }
            2 => {
                seq += 1;
                // A fencing token one behind now and then: it must be refused.
                let epoch = known[key as usize].saturating_sub(rng.below(2));
                let cmd = json!({"Release": {"key": key, "epoch": epoch}});
                let ret = write_within(&c, &urls, (n as u64, seq), cmd, within)
                    .await
                    .map(|out| ret_of(&out));
                (Op::Release { epoch }, ret)
            }
            _ => (Op::Read, read_within(&c, &urls, key, within).await),
        };
        let ret = ret.map(|r| (r, origin.elapsed()));
        history.lock().unwrap().push(Event {
            client: n,
            key,
            op,
            ret,
            invoke,
        });
        if ret.is_none() {
            // Gave up: the operation stays in flight to the end of the history.
            break;
        }
    }
}

/// A session's steps through the router until the fault phase ends, each answer recorded
/// with when it was sent and when it ended.
async fn router_client(
    url: String,
    session: String,
    answers: Arc<Mutex<Vec<(Duration, Duration, Answer)>>>,
    origin: Instant,
    stream: bool,
) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    while origin.elapsed() < FAULT_PHASE {
        let sent = origin.elapsed();
        let a = ask(&http, &url, &session, stream).await;
        let cut = matches!(a, Answer::Cut(_));
        answers.lock().unwrap().push((sent, origin.elapsed(), a));
        if cut {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn randomized_fault_runs_keep_every_promise() {
    let runs = env_u64("OWNERSERVE_CHAOS_RUNS", 2);
    let first = env_u64("OWNERSERVE_CHAOS_SEED", 1);
    let parallel = env_u64("OWNERSERVE_CHAOS_PARALLEL", 1).max(1);
    let started = Instant::now();
    let next = Arc::new(Mutex::new(first));
    let reports = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..parallel)
        .map(|_| {
            let (next, reports) = (next.clone(), reports.clone());
            std::thread::spawn(move || loop {
                let seed = {
                    let mut n = next.lock().unwrap();
                    if *n >= first + runs {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let t = Instant::now();
                let r = one_run(seed);
                println!(
                    "run {seed}: {:.1} s, {} faults, {} directory ops ({} unanswered), {} requests ({} complete, {} clean errors, {} cut by a router kill), {} violations",
                    t.elapsed().as_secs_f64(),
                    r.faults.len(),
                    r.directory_ops,
                    r.directory_unanswered,
                    r.requests,
                    r.complete,
                    r.clean_errors,
                    r.cut,
                    r.violations.len()
                );
                for v in &r.violations {
                    println!("  run {seed} violation: {v}");
                }
                reports.lock().unwrap().push((seed, r));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let reports = reports.lock().unwrap();
    let count = |f: &dyn Fn(&(Victim, Fault)) -> bool| {
        reports
            .iter()
            .map(|(_, r)| r.faults.iter().filter(|x| f(x)).count())
            .sum::<usize>()
    };
    let violations: usize = reports.iter().map(|(_, r)| r.violations.len()).sum();
    println!(
        "chaos: {} runs in {:.0} s; faults: {} kill -9 + restart, {} SIGSTOP/SIGCONT ({} on directory nodes, {} on engines, {} on the router); {} directory ops, {} router requests; {violations} violations",
        reports.len(),
        started.elapsed().as_secs_f64(),
        count(&|(_, f)| *f == Fault::Kill),
        count(&|(_, f)| *f == Fault::Stop),
        count(&|(v, _)| matches!(v, Victim::Node(_))),
        count(&|(v, _)| matches!(v, Victim::Worker(_))),
        count(&|(v, _)| *v == Victim::Router),
        reports.iter().map(|(_, r)| r.directory_ops).sum::<usize>(),
        reports.iter().map(|(_, r)| r.requests).sum::<usize>(),
    );
    assert_eq!(reports.len() as u64, runs);
    assert_eq!(violations, 0, "see the violations above");
}
