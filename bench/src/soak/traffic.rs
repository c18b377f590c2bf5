//! The soak's clients: closed-loop agents through the two routers, each running one
//! piece of work after another, paced by tool gaps:
//! - a **chat session** of 4–10 streamed steps whose prompt grows by a tool result each
//!   step (all sessions share a long system prompt), sometimes **forking** a sub-agent
//!   (`x-ownerserve-fork`, `n = 2`) that runs a few steps of its own, some streams **cut**
//!   by the client after two frames, most sessions **closed** on their last step
//!   (`x-ownerserve-session-control: close`), the rest left to lapse;
//! - a **Responses chain** of 3–6 turns (`store: true`, each naming the previous
//!   response), which ends early when the worker holding it was killed.
//!
//! An agent starts each piece of work on its own router and moves to the other when its
//! router refuses the connection (as a load balancer would), retrying that request once
//! there and keeping to it for the rest of that work. Every
//! request is recorded with its outcome and, for streams, its time to the first frame;
//! every answer that ran under an ownership epoch records the session's epoch, which the
//! directory must never fall behind.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use ownerserve_planner::policy::SplitMix64;

/// Which API a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Stream,
    Fork,
    Responses,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The client dropped the stream on purpose.
    ClientCut,
    /// An answer other than 2xx.
    Status(u16),
    /// The connection failed or broke, or the stream ended without `[DONE]`.
    Broken,
    /// A follow-up refused because its previous response's worker was killed since.
    ResponseGone,
    /// A follow-up whose previous response is not found (404/410) though its worker was
    /// never killed since: an acknowledged store lost.
    ResponseLost(String),
}

/// One request.
#[derive(Debug, Clone)]
pub struct Request {
    /// Seconds since the soak began, when it was sent.
    pub at_s: f64,
    pub api: Api,
    pub outcome: Outcome,
    /// Streams: time to the first frame.
    pub ttft_ms: Option<f64>,
    pub ms: f64,
}

/// An answer that named the session's ownership epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub epoch: u64,
    /// Seconds since the soak began, when it was answered.
    pub at_s: f64,
    /// The worker that served it (`x-ownerserve-worker`).
    pub worker: Option<String>,
}

/// Everything the clients saw, shared with the sampler and the report.
#[derive(Debug, Default)]
pub struct Records {
    pub requests: Vec<Request>,
    /// Session → the answer that ran under its highest epoch.
    pub epochs: HashMap<String, Answered>,
    /// Sessions whose client sent a close (the directory ends them).
    pub closed: HashSet<String>,
    /// Worker name → seconds of each kill -9 (a stored response dies with its worker).
    pub kills: HashMap<String, Vec<f64>>,
}

/// The agents' shared setup.
pub struct Traffic {
    pub http: reqwest::Client,
    pub routers: Vec<String>,
    pub model: String,
    pub records: Arc<Mutex<Records>>,
    pub since: Instant,
}

/// The long system prompt every session shares (tool definitions, as agents send).
fn system_prompt() -> String {
    let tools: String = (0..120)
        .map(|i| format!("tool_{i}(path, pattern, limit) reads or edits files of the repository. "))
        .collect();
    format!("You are a coding agent working in a repository. Tools: {tools}")
}

/// `n` words no other `seed` shares.
fn words(seed: &str, n: u64) -> String {
    (0..n).map(|i| format!("{seed}w{i} ")).collect()
}

/// What a chat step asks for beyond its messages.
#[derive(Default)]
struct Step<'a> {
    stream: bool,
    cut: bool,
    fork: Option<&'a str>,
    close: bool,
    max_tokens: u64,
}

impl Traffic {
    fn now_s(&self) -> f64 {
        self.since.elapsed().as_secs_f64()
    }

    fn record(&self, r: Request) {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests
            .push(r);
    }

    fn record_epoch(&self, session: &str, epoch: u64, worker: Option<String>) {
        let answered = Answered {
            epoch,
            at_s: self.now_s(),
            worker,
        };
        let mut recs = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let e = recs
            .epochs
            .entry(session.to_owned())
            .or_insert_with(|| answered.clone());
        if epoch >= e.epoch {
            *e = answered;
        }
    }

    /// Sends `build(router)` to the agent's router; on a refused connection moves the
    /// agent to the other router and sends it once more there (the failed attempt is
    /// recorded as broken).
    async fn send(
        &self,
        home: &mut usize,
        api: Api,
        build: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> (f64, Instant, Result<reqwest::Response, ()>) {
        for attempt in 0..2 {
            let (at_s, t) = (self.now_s(), Instant::now());
            match build(&self.routers[*home]).send().await {
                Ok(r) => return (at_s, t, Ok(r)),
                Err(e) if attempt == 0 && e.is_connect() => {
                    self.record(Request {
                        at_s,
                        api,
                        outcome: Outcome::Broken,
                        ttft_ms: None,
                        ms: t.elapsed().as_secs_f64() * 1e3,
                    });
                    *home = (*home + 1) % self.routers.len();
                }
                Err(_) => return (at_s, t, Err(())),
            }
        }
        (self.now_s(), Instant::now(), Err(()))
    }

    /// One chat step of `session`; whether it was answered in full.
    async fn chat(&self, home: &mut usize, session: &str, messages: &[Value], s: Step<'_>) -> bool {
        let api = match (s.fork.is_some(), s.stream) {
            (true, _) => Api::Fork,
            (false, true) => Api::Stream,
            (false, false) => Api::Chat,
        };
        let mut body = json!({"model": self.model, "messages": messages,
                              "max_tokens": s.max_tokens, "stream": s.stream});
        if s.fork.is_some() {
            body["n"] = json!(2);
        }
        if s.close {
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closed
                .insert(session.to_owned());
        }
        let (at_s, t, sent) = self
            .send(home, api, |router| {
                let mut req = self
                    .http
                    .post(format!("{router}/v1/chat/completions"))
                    .header("x-session-id", session)
                    .json(&body);
                if let Some(child) = s.fork {
                    req = req.header("x-ownerserve-fork", child);
                }
                if s.close {
                    req = req.header("x-ownerserve-session-control", "close");
                }
                req
            })
            .await;
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let done = |outcome, ttft_ms| {
            let ok = outcome == Outcome::Ok;
            self.record(Request {
                at_s,
                api,
                outcome,
                ttft_ms,
                ms: ms(t),
            });
            ok
        };
        let Ok(mut resp) = sent else {
            return done(Outcome::Broken, None);
        };
        if !resp.status().is_success() {
            return done(Outcome::Status(resp.status().as_u16()), None);
        }
        let epoch = resp
            .headers()
            .get("x-ownerserve-epoch")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        // A fork's answer runs under the parent's or the child's epoch; only plain steps
        // say which session it is.
        if let (Some(e), None) = (epoch, s.fork) {
            let worker = resp
                .headers()
                .get("x-ownerserve-worker")
                .and_then(|v| Some(v.to_str().ok()?.to_owned()));
            self.record_epoch(session, e, worker);
        }
        if !s.stream {
            return match resp.bytes().await {
                Ok(_) => done(Outcome::Ok, None),
                Err(_) => done(Outcome::Broken, None),
            };
        }
        let (mut ttft, mut frames, mut tail) = (None, 0, Vec::new());
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    ttft.get_or_insert_with(|| ms(t));
                    frames += 1;
                    tail.extend_from_slice(&c);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 1024);
                    }
                    if s.cut && frames >= 2 {
                        return done(Outcome::ClientCut, ttft);
                    }
                }
                Ok(None) => break,
                Err(_) => return done(Outcome::Broken, ttft),
            }
        }
        let text = String::from_utf8_lossy(&tail);
        match text.contains("[DONE]") && !text.contains("\"error\"") {
            true => done(Outcome::Ok, ttft),
            false => done(Outcome::Broken, ttft),
        }
    }

    /// One Responses turn: the new response's id and worker, if it was stored.
    async fn respond(
        &self,
        home: &mut usize,
        input: &str,
        previous: Option<&(String, String, f64)>,
    ) -> Option<(String, String, f64)> {
        let mut body = json!({"model": self.model, "input": input,
                              "max_output_tokens": 16, "store": true});
        if let Some((id, _, _)) = previous {
            body["previous_response_id"] = json!(id);
        }
        let (at_s, t, sent) = self
            .send(home, Api::Responses, |router| {
                self.http.post(format!("{router}/v1/responses")).json(&body)
            })
            .await;
        let worker = sent.as_ref().ok().and_then(|r| {
            let w = r.headers().get("x-ownerserve-worker")?;
            Some(w.to_str().ok()?.to_owned())
        });
        let status = sent
            .as_ref()
            .map(reqwest::Response::status)
            .map_err(|&()| ());
        let answer: Option<Value> = match sent {
            Ok(r) if r.status().is_success() => r.json().await.ok(),
            _ => None,
        };
        let outcome = match (status, &answer) {
            (Ok(s), Some(_)) if s.is_success() => Outcome::Ok,
            (Ok(s), _) if [404, 410, 503].contains(&s.as_u16()) && previous.is_some() => {
                self.judge_follow_up(s.as_u16(), previous)
            }
            (Ok(s), _) => Outcome::Status(s.as_u16()),
            (Err(()), _) => Outcome::Broken,
        };
        self.record(Request {
            at_s,
            api: Api::Responses,
            outcome,
            ttft_ms: None,
            ms: t.elapsed().as_secs_f64() * 1e3,
        });
        let id = answer?["id"].as_str()?.to_owned();
        Some((id, worker?, at_s))
    }

    /// A follow-up refused for its previous response: gone with its killed worker, lost,
    /// or (503 with the worker alive) an owner not answering now.
    fn judge_follow_up(&self, status: u16, previous: Option<&(String, String, f64)>) -> Outcome {
        let Some((id, worker, stored_at)) = previous else {
            return Outcome::Status(status);
        };
        let recs = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let killed = recs
            .kills
            .get(worker)
            .is_some_and(|ks| ks.iter().any(|k| k >= stored_at));
        match (killed, status) {
            (true, _) => Outcome::ResponseGone,
            (false, 503) => Outcome::Status(503),
            (false, _) => Outcome::ResponseLost(format!("{id} on {worker}: {status}")),
        }
    }
}

/// Runs agent `id` until `stop`.
pub async fn agent(tr: Arc<Traffic>, id: usize, seed: u64, stop: CancellationToken) {
    let mut rng = SplitMix64::new(seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
    let system = system_prompt();
    for n in 0u64.. {
        if stop.is_cancelled() {
            return;
        }
        // Each piece of work starts on the agent's own router, as a load balancer spreads
        // new connections again once a router is back.
        let mut home = id % tr.routers.len();
        let name = format!("soak-s{seed}-a{id}-{n}");
        if rng.next_f64() < 0.7 {
            chat_session(&tr, &mut home, &mut rng, &name, &system, &stop).await;
        } else {
            responses_chain(&tr, &mut home, &mut rng, &name, &stop).await;
        }
    }
}

/// A tool gap: 0.3–2.5 s; false when `stop` fired meanwhile.
async fn gap(rng: &mut SplitMix64, stop: &CancellationToken) -> bool {
    let ms = 300 + (rng.next_f64() * 2200.0) as u64;
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(Duration::from_millis(ms)) => true,
    }
}

fn below(rng: &mut SplitMix64, n: u64) -> u64 {
    rng.next_u64() % n.max(1)
}

async fn chat_session(
    tr: &Traffic,
    home: &mut usize,
    rng: &mut SplitMix64,
    session: &str,
    system: &str,
    stop: &CancellationToken,
) {
    let steps = 4 + below(rng, 7);
    let close = rng.next_f64() < 0.75;
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": format!("Task {session}: {}", words(session, 40))}),
    ];
    for step in 0..steps {
        let max_tokens = 8 + below(rng, 41);
        if step >= 2 && rng.next_f64() < 0.2 {
            let child = format!("{session}-sub{step}");
            let fork = Step {
                fork: Some(&child),
                max_tokens,
                ..Step::default()
            };
            if tr.chat(home, session, &messages, fork).await {
                sub_agent(tr, home, rng, &child, &messages, stop).await;
            }
        } else {
            let last = step + 1 == steps;
            let stream = rng.next_f64() < 0.85;
            let s = Step {
                stream,
                cut: stream && !last && rng.next_f64() < 0.1,
                close: last && close,
                max_tokens,
                ..Step::default()
            };
            tr.chat(home, session, &messages, s).await;
        }
        messages.push(json!({"role": "assistant", "content": format!("Calling tool_{step}.")}));
        let result = words(&format!("{session}-r{step}"), 100 + below(rng, 500));
        messages.push(json!({"role": "user", "content": format!("Tool result: {result}")}));
        if !gap(rng, stop).await {
            return;
        }
    }
}

/// A forked sub-agent: 1–3 streamed steps of its own, the last closing it.
async fn sub_agent(
    tr: &Traffic,
    home: &mut usize,
    rng: &mut SplitMix64,
    child: &str,
    parent: &[Value],
    stop: &CancellationToken,
) {
    let mut messages = parent.to_vec();
    messages.push(
        json!({"role": "user", "content": format!("Sub-task {child}: {}", words(child, 30))}),
    );
    let steps = 1 + below(rng, 3);
    for step in 0..steps {
        if !gap(rng, stop).await {
            return;
        }
        let s = Step {
            stream: true,
            close: step + 1 == steps,
            max_tokens: 8 + below(rng, 25),
            ..Step::default()
        };
        tr.chat(home, child, &messages, s).await;
        messages.push(json!({"role": "assistant", "content": "Done."}));
        messages.push(json!({"role": "user", "content": words(&format!("{child}-{step}"), 80)}));
    }
}

async fn responses_chain(
    tr: &Traffic,
    home: &mut usize,
    rng: &mut SplitMix64,
    chain: &str,
    stop: &CancellationToken,
) {
    let turns = 3 + below(rng, 4);
    let mut previous = None;
    for turn in 0..turns {
        let input = format!(
            "{chain} turn {turn}: {}",
            words(&format!("{chain}-{turn}"), 60 + below(rng, 200))
        );
        previous = tr.respond(home, &input, previous.as_ref()).await;
        if previous.is_none() || !gap(rng, stop).await {
            return;
        }
    }
}

/// Whether one plain chat completion through `router` succeeds (a recovery probe).
pub async fn probe(http: &reqwest::Client, router: &str, model: &str) -> bool {
    let body = json!({"model": model, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "soak probe"}]});
    http.post(format!("{router}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follow_up_refused_after_its_worker_was_killed_is_gone_and_otherwise_lost() {
        let tr = Traffic {
            http: reqwest::Client::new(),
            routers: vec![],
            model: String::new(),
            records: Arc::default(),
            since: Instant::now(),
        };
        tr.records
            .lock()
            .unwrap()
            .kills
            .insert("decode-0".into(), vec![10.0]);
        let prev = |w: &str, at| Some(("r1".to_owned(), w.to_owned(), at));
        assert_eq!(
            tr.judge_follow_up(410, prev("decode-0", 5.0).as_ref()),
            Outcome::ResponseGone
        );
        assert_eq!(
            tr.judge_follow_up(410, prev("decode-0", 11.0).as_ref()),
            Outcome::ResponseLost("r1 on decode-0: 410".into())
        );
        assert_eq!(
            tr.judge_follow_up(503, prev("decode-1", 5.0).as_ref()),
            Outcome::Status(503)
        );
    }
}
