//! The simulated engine's HTTP surface, shaped like vLLM's OpenAI server:
//! `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
//! `GET /metrics`. Streams are SSE in OpenAI's chunk format, ending with `data: [DONE]`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::SimConfig;
use super::engine::{self, EngineHandle, SeqEvent, SeqRequest};
use super::filler;
use super::scheduler::SchedulerConfig;
use crate::kv_events::publisher::{BindError, Publisher};
use crate::openai::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, Chunk, Completion, Delta, FinishReason,
    TextChoice, TextChunkChoice, Usage, UsageField,
};
use crate::openai::{self, Endpoint, ParsedRequest};

/// Largest request body the worker reads (vLLM has no small limit either).
const BODY_LIMIT_BYTES: usize = 64 * 1024 * 1024;

struct AppState {
    engine: EngineHandle,
    served_model: Arc<str>,
    scheduler: SchedulerConfig,
    started_unix: u64,
    /// Distinguishes this worker's response ids from other workers' (nanoseconds at start).
    id_salt: u64,
    next_id: AtomicU64,
}

/// Serves a simulated worker on `listener` until `shutdown` fires, then drains. KV events
/// go out through `publisher` when given (bind it with [`bind_publisher`]).
pub async fn serve(
    listener: TcpListener,
    cfg: SimConfig,
    publisher: Option<Publisher>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let tracker = TaskTracker::new();
    let kv_tx = publisher.map(|p| {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(p.run(rx, shutdown.child_token()));
        tx
    });
    let engine = engine::spawn(&cfg, kv_tx, shutdown.child_token(), &tracker);
    let app = app(engine, &cfg);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await;
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    result
}

/// Binds the KV-event sockets a config asks for (none if it asks for none).
pub async fn bind_publisher(cfg: &SimConfig) -> Result<Option<Publisher>, BindError> {
    let Some(kv) = &cfg.kv_events else {
        return Ok(None);
    };
    Publisher::bind(
        &kv.endpoint,
        kv.replay_endpoint.as_deref(),
        kv.encoding,
        &kv.topic,
        kv.buffer_steps,
    )
    .await
    .map(Some)
}

/// The worker's routes over a running engine.
pub fn app(engine: EngineHandle, cfg: &SimConfig) -> Router {
    let state = Arc::new(AppState {
        engine,
        served_model: cfg.served_model_name.as_str().into(),
        scheduler: cfg.scheduler.clone(),
        started_unix: unix_now(),
        id_salt: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        next_id: AtomicU64::new(0),
    });
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .fallback(|| async {
            error_response(
                StatusCode::NOT_FOUND,
                "not found",
                "NotFoundError",
                None,
                None,
            )
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            message,
            kind,
            param,
            code,
        },
    };
    json_response(status, &body)
}

fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": &*st.served_model,
            "object": "model",
            "created": st.started_unix,
            "owned_by": "ownerserve-sim",
            "root": &*st.served_model,
            "max_model_len": st.scheduler.max_model_len,
        }],
    });
    json_response(StatusCode::OK, &body)
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.engine.metrics().render(&st.served_model);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

async fn reset_prefix_cache(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.reset_prefix_cache().await {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => error_response(
            StatusCode::CONFLICT,
            "requests are running; the prefix cache can only be reset when idle",
            "ConflictError",
            None,
            None,
        ),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, &headers, body, Endpoint::ChatCompletions).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, &headers, body, Endpoint::Completions).await
}

/// Everything a response needs to know besides the events.
struct ResponseMeta {
    id: String,
    created: u64,
    model: Arc<str>,
    endpoint: Endpoint,
    include_usage: bool,
    /// Choices per prompt.
    n: u32,
    prompt_lens: Vec<usize>,
}

async fn generate(
    st: Arc<AppState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return error_response(e.status(), &e.body_text(), "BadRequestError", None, None),
    };
    let req = match openai::parse(&body, endpoint) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &e.message,
                "BadRequestError",
                e.param.as_deref(),
                Some(e.code),
            )
        }
    };
    if *req.model != *st.served_model {
        let msg = format!("The model `{}` does not exist.", req.model);
        return error_response(
            StatusCode::NOT_FOUND,
            &msg,
            "NotFoundError",
            Some("model"),
            Some("model_not_found"),
        );
    }
    let (seqs, prompt_lens) = match plan_sequences(&req, &st.scheduler) {
        Ok(v) => v,
        Err(msg) => {
            return error_response(StatusCode::BAD_REQUEST, &msg, "BadRequestError", None, None)
        }
    };
    let Ok(events) = st.engine.submit(seqs) else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine is shutting down",
            "ServiceUnavailableError",
            None,
            None,
        );
    };
    let prefix = match endpoint {
        Endpoint::ChatCompletions => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let id = match headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        Some(rid) => format!("{prefix}-{rid}"),
        None => format!(
            "{prefix}-{:016x}{:08x}",
            st.id_salt,
            st.next_id.fetch_add(1, Ordering::Relaxed)
        ),
    };
    let meta = ResponseMeta {
        id,
        created: unix_now(),
        model: st.served_model.clone(),
        endpoint,
        include_usage: req.include_usage,
        n: req.sampling.n,
        prompt_lens,
    };
    if req.stream {
        let body = SseBody {
            events,
            state: Accumulator::new(&meta),
            meta,
            pending: VecDeque::new(),
            done: false,
        };
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::new(body))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    } else {
        collect(events, meta).await
    }
}

/// Turns a request into one engine sequence per (prompt, choice).
fn plan_sequences(
    req: &ParsedRequest<'_>,
    limits: &SchedulerConfig,
) -> Result<(Vec<SeqRequest>, Vec<usize>), String> {
    let s = &req.sampling;
    let stop: Arc<[String]> = s.stop.clone().into();
    let prompts = req.prompt_tokens();
    let mut seqs = Vec::with_capacity(prompts.len() * s.n as usize);
    let mut lens = Vec::with_capacity(prompts.len());
    for (p, tokens) in prompts.into_iter().enumerate() {
        let max_tokens = s
            .max_tokens
            .unwrap_or_else(|| limits.default_max_tokens(tokens.len()));
        limits
            .check(tokens.len(), max_tokens)
            .map_err(|e| e.to_string())?;
        if max_tokens == 0 {
            return Err("the prompt leaves no room for generated tokens".to_owned());
        }
        lens.push(tokens.len());
        let prompt: Arc<[u32]> = tokens.into();
        for c in 0..s.n {
            let seed = filler::stream_seed(&prompt, s.seed, s.temperature, c);
            seqs.push(SeqRequest {
                choice: p as u32 * s.n + c,
                prompt: prompt.clone(),
                max_tokens,
                eos_after: (!s.ignore_eos).then(|| filler::natural_length(seed)),
                stop: stop.clone(),
                stream_seed: seed,
            });
        }
    }
    Ok((seqs, lens))
}

/// Per-choice progress shared by the streaming and the collecting paths.
struct Accumulator {
    texts: Vec<String>,
    finish: Vec<Option<FinishReason>>,
    started: Vec<bool>,
    completion_tokens: u64,
    cached_tokens: u64,
    unfinished: usize,
    error: Option<String>,
}

impl Accumulator {
    fn new(meta: &ResponseMeta) -> Self {
        let choices = meta.prompt_lens.len() * meta.n as usize;
        Self {
            texts: vec![String::new(); choices],
            finish: vec![None; choices],
            started: vec![false; choices],
            completion_tokens: 0,
            cached_tokens: 0,
            unfinished: choices,
            error: None,
        }
    }

    fn usage(&self, meta: &ResponseMeta) -> Usage {
        let prompt: usize = meta.prompt_lens.iter().sum();
        Usage::new(prompt as u64, self.completion_tokens, self.cached_tokens)
    }

    /// Applies an event; returns the token text and finish of a `Token` event.
    fn apply(
        &mut self,
        meta: &ResponseMeta,
        ev: SeqEvent,
    ) -> Option<(u32, String, Option<FinishReason>)> {
        match ev {
            SeqEvent::Admitted {
                choice,
                cached_tokens,
            } => {
                // Count each prompt once, through its first choice.
                if choice % meta.n == 0 {
                    self.cached_tokens += u64::from(cached_tokens);
                }
                None
            }
            SeqEvent::Token {
                choice,
                text,
                finish,
            } => {
                self.completion_tokens += 1;
                if finish.is_some() {
                    self.unfinished = self.unfinished.saturating_sub(1);
                    if let Some(f) = self.finish.get_mut(choice as usize) {
                        *f = finish;
                    }
                }
                Some((choice, text, finish))
            }
            SeqEvent::Rejected { error, .. } => {
                self.error = Some(error.to_string());
                self.unfinished = 0;
                None
            }
        }
    }
}

async fn collect(mut events: mpsc::UnboundedReceiver<SeqEvent>, meta: ResponseMeta) -> Response {
    let mut acc = Accumulator::new(&meta);
    while acc.unfinished > 0 {
        let Some(ev) = events.recv().await else {
            acc.error = Some("the engine stopped before the request finished".to_owned());
            break;
        };
        if let Some((choice, text, _)) = acc.apply(&meta, ev) {
            if let Some(t) = acc.texts.get_mut(choice as usize) {
                t.push_str(&text);
            }
        }
    }
    if let Some(err) = &acc.error {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            err,
            "InternalServerError",
            None,
            None,
        );
    }
    let usage = acc.usage(&meta);
    let finish = |i: usize| acc.finish[i].unwrap_or(FinishReason::Length);
    match meta.endpoint {
        Endpoint::ChatCompletions => json_response(
            StatusCode::OK,
            &Completion {
                id: &meta.id,
                object: "chat.completion",
                created: meta.created,
                model: &meta.model,
                choices: acc
                    .texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| ChatChoice {
                        index: i as u32,
                        message: AssistantMessage {
                            role: "assistant",
                            content: t,
                        },
                        logprobs: None,
                        finish_reason: finish(i),
                    })
                    .collect(),
                usage,
            },
        ),
        Endpoint::Completions => json_response(
            StatusCode::OK,
            &Completion {
                id: &meta.id,
                object: "text_completion",
                created: meta.created,
                model: &meta.model,
                choices: acc
                    .texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| TextChoice {
                        index: i as u32,
                        text: t,
                        logprobs: None,
                        finish_reason: finish(i),
                    })
                    .collect(),
                usage,
            },
        ),
    }
}

/// One `data: <json>\n\n` server-sent event.
fn sse_event(value: &impl Serialize) -> Option<Bytes> {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut buf, value).ok()?;
    buf.extend_from_slice(b"\n\n");
    Some(Bytes::from(buf))
}

/// SSE body fed directly by the engine's event channel: no task per stream, and dropping
/// the body (client gone) closes the channel so the engine aborts the sequences.
struct SseBody {
    events: mpsc::UnboundedReceiver<SeqEvent>,
    meta: ResponseMeta,
    state: Accumulator,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl SseBody {
    fn usage_field(&self) -> UsageField {
        if self.meta.include_usage {
            UsageField::Null(None)
        } else {
            UsageField::Absent
        }
    }

    /// Queues one chunk of this endpoint's kind.
    fn push_chunk<C: Serialize>(&mut self, choices: Vec<C>, usage: UsageField) {
        let object = match self.meta.endpoint {
            Endpoint::ChatCompletions => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let chunk = Chunk {
            id: &self.meta.id,
            object,
            created: self.meta.created,
            model: &self.meta.model,
            choices,
            usage,
        };
        self.pending.extend(sse_event(&chunk));
    }

    fn chat_chunk(&mut self, choice: u32, delta: Delta<'_>, finish: Option<FinishReason>) {
        let choices = vec![ChatChunkChoice {
            index: choice,
            delta,
            logprobs: None,
            finish_reason: finish,
        }];
        self.push_chunk(choices, self.usage_field());
    }

    fn on_event(&mut self, ev: SeqEvent) {
        let Some((choice, text, finish)) = self.state.apply(&self.meta, ev) else {
            return;
        };
        match self.meta.endpoint {
            Endpoint::ChatCompletions => {
                let first = !std::mem::replace(&mut self.state.started[choice as usize], true);
                if first {
                    let delta = Delta {
                        role: Some("assistant"),
                        content: Some(""),
                    };
                    self.chat_chunk(choice, delta, None);
                }
                if !text.is_empty() {
                    let delta = Delta {
                        role: None,
                        content: Some(&text),
                    };
                    self.chat_chunk(choice, delta, None);
                }
                if finish.is_some() {
                    let delta = Delta {
                        role: None,
                        content: None,
                    };
                    self.chat_chunk(choice, delta, finish);
                }
            }
            Endpoint::Completions => {
                if text.is_empty() && finish.is_none() {
                    return;
                }
                let choices = vec![TextChunkChoice {
                    index: choice,
                    text: &text,
                    logprobs: None,
                    finish_reason: finish,
                }];
                self.push_chunk(choices, self.usage_field());
            }
        }
    }

    fn on_end(&mut self) {
        if let Some(err) = self.state.error.take().or_else(|| {
            (self.state.unfinished > 0)
                .then(|| "the engine stopped before the request finished".to_owned())
        }) {
            let body = ErrorBody {
                error: ErrorDetail {
                    message: &err,
                    kind: "InternalServerError",
                    param: None,
                    code: None,
                },
            };
            self.pending.extend(sse_event(&body));
        } else if self.meta.include_usage {
            let usage = UsageField::Totals(self.state.usage(&self.meta));
            self.push_chunk(Vec::<()>::new(), usage);
        }
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
    }
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(http_body::Frame::data(b))));
            }
            if self.done {
                return Poll::Ready(None);
            }
            if self.state.unfinished == 0 {
                self.on_end();
                continue;
            }
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(ev)) => self.on_event(ev),
                Poll::Ready(None) => self.on_end(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
