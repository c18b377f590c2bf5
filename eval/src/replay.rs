//! Live replay (`ownerserve replay`): drives a running router over HTTP with a workload,
//! the same requests the simulator runs: each step is a streaming `/v1/completions` call
//! whose prompt is the step's token ids (so the router and engines hash exactly the
//! blocks the simulator does), `max_tokens` its output length with `ignore_eos`, `n` its
//! samples, the session in `x-session-id` and forks marked with `x-ownerserve-fork`.
//! Closed-loop sessions wait for each response and the tool gap; open-loop steps go at
//! their arrival times. Times are measured at the client and reported in the fleet's
//! simulated seconds (wall seconds × `time_scale`), so they compare with the simulator's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::sim::{RunResult, StepRecord};
use crate::workload::{prompt_tokens, Loop, Workload};

/// Where and how to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The router's base URL, e.g. `http://127.0.0.1:8080`.
    pub target: String,
    /// The `model` every request names.
    pub model: String,
    /// Simulated seconds per wall second of the fleet (its workers' `time_scale`): waits
    /// are divided by it, measured times multiplied.
    pub time_scale: f64,
    /// Bearer token for the router, if it wants one.
    pub token: Option<String>,
    /// Longest a single request may take, wall time.
    pub timeout: Duration,
    /// The model's vocabulary, when smaller than the token ids the workload draws (up to
    /// 60,000): every id is folded into `4..vocab` (a tiny test model's 4,096 tokens), the
    /// same id always to the same one, so prompts that share a block still do.
    pub vocab: Option<u32>,
}

/// What made a replay fail as a whole (single failed requests are recorded, not fatal).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("time_scale must be positive")]
    TimeScale,
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

struct Shared {
    wl: Workload,
    opts: ReplayOptions,
    http: reqwest::Client,
    start: Instant,
    children: HashMap<(usize, usize), Vec<usize>>,
    records: std::sync::Mutex<Vec<StepRecord>>,
    done: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

/// A replay's measurements, in the simulator's result shape (only the client-side fields
/// are filled), and the first few errors seen.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub result: RunResult,
    pub errors: Vec<String>,
}

impl Shared {
    fn virtual_s(&self, at: Instant) -> f64 {
        at.duration_since(self.start).as_secs_f64() * self.opts.time_scale
    }

    async fn sleep_until_virtual(&self, at_s: f64) {
        let wall = Duration::from_secs_f64((at_s / self.opts.time_scale).max(0.0));
        tokio::time::sleep_until((self.start + wall).into()).await;
    }

    /// Sends one step and measures it.
    async fn send(&self, session: usize, step: usize) -> StepRecord {
        let st = &self.wl.sessions[session].steps[step];
        let mut prompt = prompt_tokens(st, self.wl.hash_block);
        if let Some(vocab) = self.opts.vocab.filter(|&v| v > 4) {
            for t in &mut prompt {
                *t = 4 + *t % (vocab - 4);
            }
        }
        let (name, fork) = self.wl.route_names(session, step);
        let body = json!({
            "model": self.opts.model,
            "prompt": prompt,
            "max_tokens": st.output_tokens.max(1),
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
            "n": st.samples.max(1),
        });
        let mut req = self
            .http
            .post(format!(
                "{}/v1/completions",
                self.opts.target.trim_end_matches('/')
            ))
            .header("x-session-id", name)
            .json(&body);
        if let Some(child) = fork {
            req = req.header("x-ownerserve-fork", child);
        }
        if let Some(t) = &self.opts.token {
            req = req.bearer_auth(t);
        }
        let sent = Instant::now();
        let mut rec = StepRecord {
            session,
            step,
            issued_s: self.virtual_s(sent),
            ttft_s: f64::NAN,
            tpot_s: f64::NAN,
            latency_s: 0.0,
            prompt_tokens: prompt.len() as u32,
            cached_tokens: 0,
            restored_tokens: 0,
            rejected: true,
            placement: Default::default(),
        };
        match self.stream(req, sent, st.samples.max(1)).await {
            Ok(Streamed {
                ttft,
                last,
                events,
                cached_tokens,
            }) => {
                rec.cached_tokens = cached_tokens;
                let per_choice = (events / st.samples.max(1)).max(1);
                rec.ttft_s = ttft * self.opts.time_scale;
                rec.latency_s = last * self.opts.time_scale;
                if per_choice > 1 {
                    rec.tpot_s = (last - ttft) * self.opts.time_scale / f64::from(per_choice - 1);
                }
                rec.rejected = false;
            }
            Err(e) => {
                let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
                if errors.len() < 10 {
                    errors.push(format!("session {session} step {step}: {e}"));
                }
            }
        }
        rec
    }

    /// Reads the SSE stream: its first and last token events in wall seconds after `sent`,
    /// how many arrived, and the cached prompt tokens its usage reports.
    async fn stream(
        &self,
        req: reqwest::RequestBuilder,
        sent: Instant,
        samples: u32,
    ) -> Result<Streamed, String> {
        let mut resp = req.send().await.map_err(|e| e.to_string())?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!(
                "{status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let (mut first, mut last, mut events, mut cached_tokens) = (None, 0.0, 0u32, 0u32);
        let mut buf = String::new();
        let mut finished = false;
        while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
            let now = sent.elapsed().as_secs_f64();
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let Some(data) = event.trim().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    finished = true;
                    continue;
                }
                // An answer may say "error" in its text: only an `error` member is one.
                let Ok(chunk) = serde_json::from_str::<serde_json::Value>(data) else {
                    return Err(data.chars().take(200).collect());
                };
                if chunk.get("error").is_some() {
                    return Err(data.chars().take(200).collect());
                }
                if let Some(c) = chunk
                    .pointer("/usage/prompt_tokens_details/cached_tokens")
                    .and_then(serde_json::Value::as_u64)
                {
                    cached_tokens = u32::try_from(c).unwrap_or(u32::MAX);
                }
                let texts = chunk.get("choices").and_then(serde_json::Value::as_array);
                if texts.is_some_and(|c| c.iter().any(|c| c.get("text").is_some())) {
                    first.get_or_insert(now);
                    last = now;
                    events += 1;
                }
            }
        }
        match first {
            Some(ttft) if finished => Ok(Streamed {
                ttft,
                last,
                events: events.max(samples),
                cached_tokens,
            }),
            _ => Err("the stream ended without tokens or [DONE]".to_owned()),
        }
    }
}

/// What one streamed step showed the client.
struct Streamed {
    ttft: f64,
    last: f64,
    events: u32,
    cached_tokens: u32,
}

/// Replays `wl` against the router in `opts`; `progress` is told how many steps completed.
pub async fn replay(
    wl: &Workload,
    opts: &ReplayOptions,
    progress: Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<Replayed, ReplayError> {
    if !(opts.time_scale > 0.0 && opts.time_scale.is_finite()) {
        return Err(ReplayError::TimeScale);
    }
    let http = reqwest::Client::builder()
        .timeout(opts.timeout)
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| ReplayError::Client(e.to_string()))?;
    let shared = Arc::new(Shared {
        wl: wl.clone(),
        opts: opts.clone(),
        http,
        start: Instant::now(),
        children: wl.forks_by_step(),
        records: std::sync::Mutex::new(Vec::new()),
        done: AtomicU64::new(0),
        errors: std::sync::Mutex::new(Vec::new()),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (i, s) in wl.sessions.iter().enumerate() {
        match wl.looping {
            Loop::Open => {
                for k in 0..s.steps.len() {
                    let sh = shared.clone();
                    let p = progress.clone();
                    tasks.spawn(async move {
                        let at = sh.wl.sessions[i].steps[k]
                            .arrival_ms
                            .unwrap_or(sh.wl.sessions[i].start_ms)
                            / 1e3;
                        sh.sleep_until_virtual(at).await;
                        let rec = sh.send(i, k).await;
                        sh.record(rec, &*p);
                    });
                }
            }
            Loop::Closed if s.fork_of.is_none() => {
                let at = s.start_ms / 1e3;
                tasks.spawn(run_session(shared.clone(), i, at, progress.clone()));
            }
            Loop::Closed => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    let steps = std::mem::take(&mut *shared.records.lock().unwrap_or_else(|p| p.into_inner()));
    let errors = shared
        .errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(Replayed {
        result: result_of(wl, steps),
        errors,
    })
}

impl Shared {
    fn record(&self, rec: StepRecord, progress: &(dyn Fn(u64) + Send + Sync)) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(rec);
        progress(self.done.fetch_add(1, Ordering::Relaxed) + 1);
    }
}

/// One closed-loop session from `start_s`: each step after the previous one and its tool
/// gap; forks of a step start after it, as their own sessions.
fn run_session(
    sh: Arc<Shared>,
    session: usize,
    start_s: f64,
    progress: Arc<dyn Fn(u64) + Send + Sync>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        sh.sleep_until_virtual(start_s).await;
        // The forks' tasks are owned here and joined before the session ends.
        let mut forks = tokio::task::JoinSet::new();
        let steps = sh.wl.sessions[session].steps.len();
        for k in 0..steps {
            let rec = sh.send(session, k).await;
            sh.record(rec, &*progress);
            let gap_s = sh.wl.sessions[session].steps[k].gap_after_ms.max(0.0) / 1e3;
            let next_s = sh.virtual_s(Instant::now()) + gap_s;
            for &c in sh.children.get(&(session, k)).into_iter().flatten() {
                forks.spawn(run_session(sh.clone(), c, next_s, progress.clone()));
            }
            if k + 1 < steps {
                sh.sleep_until_virtual(next_s).await;
            }
        }
        while forks.join_next().await.is_some() {}
    })
}

/// The client-side measurements in the simulator's result shape.
fn result_of(wl: &Workload, mut steps: Vec<StepRecord>) -> RunResult {
    steps.sort_by(|a, b| a.issued_s.total_cmp(&b.issued_s));
    let n = wl.sessions.len();
    let (mut first, mut last) = (vec![f64::NAN; n], vec![f64::NAN; n]);
    for s in &steps {
        let end = s.issued_s + s.latency_s;
        let (f, l) = (&mut first[s.session], &mut last[s.session]);
        *f = if f.is_nan() {
            s.issued_s
        } else {
            f.min(s.issued_s)
        };
        *l = if l.is_nan() { end } else { l.max(end) };
    }
    let session_e2e_s = first
        .iter()
        .zip(&last)
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .map(|(a, b)| b - a)
        .collect();
    let makespan_s = last
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    RunResult {
        policy: "live".to_owned(),
        workload: wl.name.clone(),
        steps,
        session_e2e_s,
        duplicate_factor: f64::NAN,
        duplicate_factor_decoders: f64::NAN,
        owner_hit_rate: f64::NAN,
        decode_interference: f64::NAN,
        makespan_s,
        ..RunResult::default()
    }
}
