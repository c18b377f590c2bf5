//! `bench replicas`' load: closed-loop clients, each running agent sessions one after
//! another (each step the previous prompt plus a turn, under `x-session-id`), every step
//! sent when the last one answered. A client's sessions stick to its home router, except
//! every `cross_every`-th, whose steps alternate between its home router and the next one:
//! those test that a router serves a session where the directory says another router's
//! claim put it. Each step's serving worker and epoch are kept for the ownership check.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::ownership_check::Served;
use crate::peer_load::words;

/// What the clients send.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The routers' URLs; client `c`'s home is router `c % len`.
    pub routers: Vec<String>,
    pub clients: usize,
    /// Steps of one session.
    pub steps: usize,
    /// Every this-many-th session of a client alternates routers (0: none do).
    pub cross_every: usize,
    /// Prefix of the run's session ids (sessions of different runs stay apart).
    pub run: String,
    pub model: String,
    pub max_tokens: u32,
    /// Bytes of the system prompt every session shares.
    pub system_bytes: usize,
}

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Each session's steps, in the order sent.
    pub sessions: BTreeMap<String, Vec<Served>>,
    /// Sorted latencies of the steps answered 2xx, ms.
    pub latencies_ms: Vec<f64>,
    pub errors: u64,
    /// The first failure, to show.
    pub first_error: Option<String>,
    /// Sessions whose steps alternated routers.
    pub cross_sessions: usize,
    /// From the first request sent to the last answer.
    pub elapsed: Duration,
}

impl Seen {
    /// Steps answered 2xx.
    pub fn requests(&self) -> u64 {
        self.latencies_ms.len() as u64
    }
}

/// The router a session's step goes to: the home router, or for a cross session the home
/// and the next router in turn.
pub fn router_of(plan: &Plan, client: usize, session: usize, step: usize) -> usize {
    let n = plan.routers.len().max(1);
    let home = client % n;
    let cross = n > 1 && plan.cross_every > 0 && session % plan.cross_every == plan.cross_every - 1;
    match cross {
        true => (home + step) % n,
        false => home,
    }
}

/// Bytes of a session's first user message and of each later user turn.
const TURN_BYTES: usize = 256;

/// The chat body of step `step` of `session` (its id seeding its text).
pub fn body(plan: &Plan, system: &str, session: &str, seed: u64, step: usize) -> String {
    let mut messages = format!(
        r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{session}: {}"}}"#,
        words(TURN_BYTES, seed)
    );
    for k in 1..=step {
        let _ = write!(
            messages,
            r#",{{"role":"assistant","content":"step {k} done"}},{{"role":"user","content":"{}"}}"#,
            words(TURN_BYTES, seed ^ ((k as u64) << 40))
        );
    }
    format!(
        r#"{{"model":"{}","max_tokens":{},"messages":{messages}]}}"#,
        plan.model, plan.max_tokens
    )
}

/// One client's figures.
#[derive(Default)]
struct ClientSeen {
    sessions: Vec<(String, Vec<Served>)>,
    latencies_ms: Vec<f64>,
    errors: u64,
    first_error: Option<String>,
    cross_sessions: usize,
}

/// Runs every client until `window` has passed (a step in flight then is finished).
pub async fn drive(http: &reqwest::Client, plan: &Plan, window: Duration) -> Seen {
    let started = Instant::now();
    let deadline = started + window;
    let system = words(plan.system_bytes, 1);
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..plan.clients {
        let (http, plan, system) = (http.clone(), plan.clone(), system.clone());
        clients.spawn(async move { client(&http, &plan, &system, c, deadline).await });
    }
    let mut seen = Seen::default();
    while let Some(done) = clients.join_next().await {
        let Ok(c) = done else {
            seen.errors += 1;
            continue;
        };
        seen.sessions.extend(c.sessions);
        seen.latencies_ms.extend(c.latencies_ms);
        seen.errors += c.errors;
        seen.cross_sessions += c.cross_sessions;
        if seen.first_error.is_none() {
            seen.first_error = c.first_error;
        }
    }
    seen.elapsed = started.elapsed();
    seen.latencies_ms.sort_by(f64::total_cmp);
    seen
}

async fn client(
    http: &reqwest::Client,
    plan: &Plan,
    system: &str,
    c: usize,
    deadline: Instant,
) -> ClientSeen {
    let mut seen = ClientSeen::default();
    let mut s = 0;
    while Instant::now() < deadline {
        let id = format!("{}-c{c}-s{s}", plan.run);
        let seed = ((c as u64) << 32) | s as u64;
        let mut steps = Vec::with_capacity(plan.steps);
        let mut routers_used = [usize::MAX; 2];
        for k in 0..plan.steps {
            if Instant::now() >= deadline {
                break;
            }
            let r = router_of(plan, c, s, k);
            routers_used[k.min(1)] = r;
            let t = Instant::now();
            match step(
                http,
                &plan.routers[r],
                &id,
                body(plan, system, &id, seed, k),
            )
            .await
            {
                Ok(served) => {
                    seen.latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
                    steps.push(served);
                }
                Err(e) => {
                    seen.errors += 1;
                    seen.first_error.get_or_insert_with(|| format!("{e:#}"));
                    break;
                }
            }
        }
        if routers_used[1] != usize::MAX && routers_used[0] != routers_used[1] {
            seen.cross_sessions += 1;
        }
        if !steps.is_empty() {
            seen.sessions.push((id, steps));
        }
        s += 1;
    }
    seen
}

/// One step: the worker and epoch the router's answer names.
async fn step(
    http: &reqwest::Client,
    router: &str,
    session: &str,
    body: String,
) -> anyhow::Result<Served> {
    let resp = http
        .post(format!("{router}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-session-id", session)
        .body(body)
        .send()
        .await?;
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let worker = header("x-ownerserve-worker");
    let epoch = header("x-ownerserve-epoch").and_then(|e| e.parse().ok());
    let text = resp.bytes().await?;
    if !status.is_success() {
        anyhow::bail!(
            "{router} answered {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    Ok(Served {
        worker: worker.context("no x-ownerserve-worker in the answer")?,
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(routers: usize, cross_every: usize) -> Plan {
        Plan {
            routers: (0..routers).map(|r| format!("http://r{r}")).collect(),
            clients: 8,
            steps: 4,
            cross_every,
            run: "t".into(),
            model: "m".into(),
            max_tokens: 4,
            system_bytes: 1024,
        }
    }

    #[test]
    fn sessions_stick_to_the_home_router_but_every_cross_one_alternates() {
        let p = plan(4, 4);
        // Client 5's home is router 1; its sessions 0..=2 stay there, session 3 alternates.
        for s in 0..3 {
            assert!((0..4).all(|k| router_of(&p, 5, s, k) == 1));
        }
        let cross: Vec<usize> = (0..4).map(|k| router_of(&p, 5, 3, k)).collect();
        assert_eq!(cross, vec![1, 2, 3, 0]);
        assert!((0..4).all(|k| router_of(&plan(1, 4), 5, 3, k) == 0));
        assert!((0..4).all(|k| router_of(&plan(4, 0), 5, 3, k) == 1));
    }

    #[test]
    fn each_step_is_a_valid_chat_request_growing_by_a_turn() {
        let p = plan(1, 0);
        let system = words(p.system_bytes, 1);
        let first = body(&p, &system, "t-c0-s0", 7, 0);
        let third = body(&p, &system, "t-c0-s0", 7, 2);
        for b in [&first, &third] {
            ownerserve_shim::openai::parse(
                b.as_bytes(),
                ownerserve_shim::openai::Endpoint::ChatCompletions,
            )
            .unwrap();
        }
        assert!(third.starts_with(&first[..first.len() - 2]));
        assert!(third.len() > first.len() + 2 * TURN_BYTES);
        assert_ne!(first, body(&p, &system, "t-c0-s1", 8, 0));
    }
}
