//! The simulated engine's HTTP surface, shaped like vLLM's OpenAI server:
//! `POST /v1/chat/completions`, `POST /v1/completions`, the coding agents' APIs
//! (`POST /v1/messages`, `POST /v1/messages/count_tokens`, `POST /v1/responses`,
//! `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, with a response store for
//! `store`, `previous_response_id` and `background`), `GET /v1/models`, `GET /health`,
//! `GET /metrics`, plus OwnerServe's KV endpoints ([`super::kv_routes`]). Responses are
//! assembled in `respond.rs` (the agents' shapes in `agent_wire.rs`).
//!
//! A chat or completions request may carry vLLM's `kv_transfer_params` (NIXL connector,
//! pull mode): `do_remote_decode` makes it a prefill leg (its prompt blocks are pinned and
//! the response says where to pull them), `do_remote_prefill` a decode leg (the prompt's KV
//! is pulled from the named engine before the request is queued). Fence headers
//! (`x-ownerserve-session`, `x-ownerserve-epoch`) are checked before any work.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::agent_wire::{Counts, ResponseEcho};
use super::config::SimConfig;
use super::engine::{self, EngineHandle, SeqRequest};
use super::fence::{AcceptLog, AcceptedFor, EpochFence, FenceClaim};
use super::filler;
use super::http_error::{error_response, json_response, ApiError};
use super::kv_client::{KvClient, PULL_PATH};
use super::kv_routes::{self, DROP_PATH, FETCH_PATH};
use super::kv_transfer::{block_bytes, KvTransferParams, KvTransferParamsOut, TransferLegs};
use super::respond::{self, ResponseMeta, ResponsesMeta, TransferReport};
use super::response_store::{owned, CancelRefused};
use super::scheduler::SchedulerConfig;
use super::state::AppState;
use crate::engines::sim::FENCE_ACCEPTED_PATH;
use crate::kv_events::publisher::{BindError, Publisher};
use crate::openai::{self, Endpoint, ParsedRequest, Prompt};

/// Largest request body the worker reads (vLLM has no small limit either).
const BODY_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// How long a pull from another engine may take before the request recomputes.
const PULL_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves a simulated worker on `listener` until `shutdown` fires, then drains. KV events
/// go out through `publisher` when given (bind it with [`bind_publisher`]).
pub async fn serve(
    listener: TcpListener,
    cfg: SimConfig,
    publisher: Option<Publisher>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let tracker = TaskTracker::new();
    let kv_tx = publisher.map(|p| {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(p.run(rx, shutdown.child_token()));
        tx
    });
    let engine = engine::spawn(&cfg, kv_tx, shutdown.child_token(), &tracker);
    let app = app(engine, &cfg, addr, &tracker);
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

/// The worker's routes over a running engine listening on `addr` (the address other
/// engines pull KV from; an unspecified IP is announced as loopback); background
/// responses run on `tasks`.
pub fn app(engine: EngineHandle, cfg: &SimConfig, addr: SocketAddr, tasks: &TaskTracker) -> Router {
    let id_salt = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let ip = if addr.ip().is_unspecified() {
        if addr.is_ipv4() {
            "127.0.0.1".to_owned()
        } else {
            "::1".to_owned()
        }
    } else {
        addr.ip().to_string()
    };
    let state = Arc::new(AppState {
        engine,
        served_model: cfg.served_model_name.as_str().into(),
        scheduler: cfg.scheduler.clone(),
        started_unix: unix_now(),
        id_salt,
        next_id: AtomicU64::new(0),
        engine_id: engine_id(id_salt, addr).into(),
        host: ip,
        port: addr.port(),
        tp_size: cfg.gpus,
        transfer: cfg.transfer,
        time: cfg.time,
        block_bytes: block_bytes(&cfg.model, cfg.scheduler.block_size),
        kv_client: KvClient::new(PULL_TIMEOUT),
        fence: Mutex::new(EpochFence::default()),
        accepted: Mutex::new(AcceptLog::default()),
        responses: Arc::default(),
        tasks: tasks.clone(),
    });
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(get_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/tokenize", post(tokenize))
        .route(PULL_PATH, post(kv_routes::pull))
        .route(FETCH_PATH, post(kv_routes::fetch))
        .route(DROP_PATH, post(kv_routes::drop_blocks))
        .route(FENCE_ACCEPTED_PATH, get(fence_accepted))
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

/// A uuid-shaped id, unique per engine start (time, process and address mixed).
fn engine_id(salt: u64, addr: SocketAddr) -> String {
    let seed = format!("{salt}/{}/{addr}", std::process::id());
    let x = xxhash_rust::xxh3::xxh3_128(seed.as_bytes());
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (x >> 96) as u32,
        (x >> 80) as u16,
        (x >> 64) as u16,
        (x >> 48) as u16,
        x & 0xffff_ffff_ffff
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

/// The claims the fence accepted, oldest first ([`FENCE_ACCEPTED_PATH`]).
async fn fence_accepted(State(st): State<Arc<AppState>>) -> Response {
    let log = st
        .accepted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    json_response(StatusCode::OK, &log)
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

/// The request parsed for `endpoint`, for the model this engine serves; else vLLM's 400
/// or 404 answer.
#[expect(
    clippy::result_large_err,
    reason = "the error is the response itself, returned at once"
)]
fn admit<'b>(
    st: &AppState,
    body: &'b Bytes,
    endpoint: Endpoint,
) -> Result<ParsedRequest<'b>, Response> {
    let req = openai::parse(body, endpoint).map_err(|e| {
        error_response(
            StatusCode::BAD_REQUEST,
            &e.message,
            "BadRequestError",
            e.param.as_deref(),
            Some(e.code),
        )
    })?;
    if *req.model != *st.served_model {
        let msg = format!("The model `{}` does not exist.", req.model);
        return Err(error_response(
            StatusCode::NOT_FOUND,
            &msg,
            "NotFoundError",
            Some("model"),
            Some("model_not_found"),
        ));
    }
    Ok(req)
}

/// `POST /tokenize` as vLLM serves it: `{model, messages | prompt}` → `{count,
/// max_model_len, tokens}`, with the engine's own (built-in) tokenizer and chat template.
async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return error_response(e.status(), &e.body_text(), "BadRequestError", None, None),
    };
    let chat = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .is_some_and(|v| v.get("messages").is_some());
    let endpoint = if chat {
        Endpoint::ChatCompletions
    } else {
        Endpoint::Completions
    };
    let req = match admit(&st, &body, endpoint) {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let tokens = req
        .rendered_prompts()
        .into_iter()
        .next()
        .map(|p| p.into_tokens())
        .unwrap_or_default();
    let body = serde_json::json!({
        "count": tokens.len(),
        "max_model_len": st.scheduler.max_model_len,
        "tokens": tokens,
    });
    json_response(StatusCode::OK, &body)
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

async fn messages(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, &headers, body, Endpoint::Messages).await
}

async fn responses(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(st, &headers, body, Endpoint::Responses).await
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}` by the engine's tokenizer.
async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return error_response(e.status(), &e.body_text(), "BadRequestError", None, None),
    };
    let req = match admit(&st, &body, Endpoint::MessagesCountTokens) {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let n = req.prompt_tokens().first().map_or(0, Vec::len);
    json_response(StatusCode::OK, &serde_json::json!({"input_tokens": n}))
}

fn response_not_found(id: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("Response with id '{id}' not found."),
        "invalid_request_error",
        Some("response_id"),
        Some("response_not_found"),
    )
}

/// `GET /v1/responses/{id}`: a stored response.
async fn get_response(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match st.responses.body(&id) {
        Some(body) => json_response(StatusCode::OK, &body),
        None => response_not_found(&id),
    }
}

/// `POST /v1/responses/{id}/cancel`: stops a background response.
async fn cancel_response(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match st.responses.cancel(&id) {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(CancelRefused::NotFound) => response_not_found(&id),
        Err(CancelRefused::NotRunning) => error_response(
            StatusCode::BAD_REQUEST,
            "Cannot cancel a synchronous response.",
            "invalid_request_error",
            None,
            None,
        ),
    }
}

/// A Responses follow-up continues the stored conversation of its `previous_response_id`.
#[expect(
    clippy::result_large_err,
    reason = "the error is the response itself, returned at once"
)]
fn continue_chain(st: &AppState, req: &mut ParsedRequest<'_>) -> Result<(), Response> {
    let Some(prev) = req.previous_response_id.as_deref() else {
        return Ok(());
    };
    let Some(before) = st.responses.conversation(prev) else {
        return Err(response_not_found(prev));
    };
    if let Prompt::Chat(messages) = &mut req.prompt {
        // The new instructions replace the stored ones (OpenAI: they do not carry over).
        let has_system = messages.first().is_some_and(|m| m.role == "system");
        let before = before
            .into_iter()
            .filter(|m| !(has_system && m.role == "system"));
        let tail = std::mem::take(messages);
        let (system, rest): (Vec<_>, Vec<_>) = tail
            .into_iter()
            .partition(|m| has_system && m.role == "system");
        messages.extend(system);
        messages.extend(before);
        messages.extend(rest);
    }
    Ok(())
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
    let mut req = match admit(&st, &body, endpoint) {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    if let Err(refused) = continue_chain(&st, &mut req) {
        return refused;
    }
    let (seqs, prompt_lens) = match plan_sequences(&req, &st.scheduler, priority_of(headers)) {
        Ok(v) => v,
        Err(msg) => {
            return error_response(StatusCode::BAD_REQUEST, &msg, "BadRequestError", None, None)
        }
    };
    let checked = transfer_legs(&req).and_then(|legs| {
        let claim = FenceClaim::from_headers(headers)?;
        let accepted_for = if legs.serve_remote_decode {
            AcceptedFor::Prefill
        } else {
            AcceptedFor::Generate
        };
        st.check_fence(claim.clone(), accepted_for)?;
        Ok((legs, claim))
    });
    let (legs, claim) = match checked {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let request_id = match headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        Some(rid) => rid.to_owned(),
        None => format!(
            "{:016x}{:08x}",
            st.id_salt,
            st.next_id.fetch_add(1, Ordering::Relaxed)
        ),
    };
    // The router sends one id on every leg of a step (prefill and decode), so this line
    // ties an engine's work to the client request.
    tracing::debug!(
        request_id = %request_id,
        prefill_leg = legs.serve_remote_decode,
        kv_load = legs.load.is_some(),
        "request received"
    );
    let id = match endpoint {
        Endpoint::ChatCompletions => format!("chatcmpl-{request_id}"),
        Endpoint::Completions => format!("cmpl-{request_id}"),
        Endpoint::Messages | Endpoint::MessagesCountTokens => format!("msg_{request_id}"),
        // Unique per engine whatever the request id, as the store keys by it.
        Endpoint::Responses => format!(
            "resp_{:016x}{:08x}",
            st.id_salt,
            st.next_id.fetch_add(1, Ordering::Relaxed)
        ),
    };
    let responses = (endpoint == Endpoint::Responses).then(|| ResponsesMeta {
        echo: ResponseEcho {
            previous_response_id: req.previous_response_id.as_deref().map(str::to_owned),
            store: req.store,
            background: req.background,
            max_output_tokens: req.sampling.max_tokens,
            temperature: req.sampling.temperature,
            top_p: req.sampling.top_p,
        },
        store: req.store.then(|| {
            let conversation = match &req.prompt {
                Prompt::Chat(m) => m.iter().map(owned).collect(),
                Prompt::Completion(_) => Vec::new(),
            };
            (st.responses.clone(), conversation)
        }),
    });
    let background = req.background;
    let mut meta = ResponseMeta {
        id,
        created: unix_now(),
        model: st.served_model.clone(),
        endpoint,
        include_usage: req.include_usage,
        n: req.sampling.n,
        prompt_lens,
        transfer: TransferReport::default(),
        kv_params: None,
        responses,
    };
    let events = match run_legs(&st, seqs, legs, claim, request_id, &mut meta).await {
        Ok(events) => events,
        Err(e) => return e.into_response(),
    };
    if background {
        // Answer at once; the task stores the finished response (or is cancelled).
        let queued = meta.queued_body(Counts::default());
        let conversation = meta
            .responses
            .as_ref()
            .and_then(|r| r.store.as_ref())
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        let id = meta.id.clone();
        st.responses.put(&id, queued.clone(), conversation);
        let task = st.tasks.spawn(async move {
            respond::collect(events, meta).await;
        });
        st.responses.set_task(&id, task.abort_handle());
        return json_response(StatusCode::OK, &queued);
    }
    if req.stream {
        respond::stream(events, meta).await
    } else {
        respond::collect(events, meta).await
    }
}

/// The request's `kv_transfer_params`, read.
fn transfer_legs(req: &ParsedRequest<'_>) -> Result<TransferLegs, ApiError> {
    let Some(raw) = req.kv_transfer_params else {
        return Ok(TransferLegs::default());
    };
    let params: KvTransferParams = serde_json::from_str(raw).map_err(|e| {
        ApiError::bad_request(
            format!("invalid 'kv_transfer_params': {e}"),
            Some("kv_transfer_params"),
        )
    })?;
    params
        .legs()
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("kv_transfer_params")))
}

/// Runs the transfer legs around the request: a decode leg loads its prompt's KV first,
/// a prefill leg asks for its blocks to be pinned; then the sequences are queued.
async fn run_legs(
    st: &AppState,
    mut seqs: Vec<SeqRequest>,
    legs: TransferLegs,
    claim: Option<FenceClaim>,
    request_id: String,
    meta: &mut ResponseMeta,
) -> Result<mpsc::UnboundedReceiver<engine::SeqEvent>, ApiError> {
    let mut received = None;
    // Only the first prompt takes part: vLLM's params describe one sequence.
    let first_prompt = seqs.first().map(|s| s.prompt.clone());
    if let (Some(load), Some(prompt)) = (&legs.load, &first_prompt) {
        let (r, report) = kv_routes::load_for_decode(st, load, prompt, claim.as_ref()).await;
        if r.is_some() {
            for s in seqs.iter_mut().filter(|s| Arc::ptr_eq(&s.prompt, prompt)) {
                s.hold_prefix = true;
            }
        }
        received = r;
        meta.transfer = report;
    }
    if legs.serve_remote_decode {
        if let Some(first) = seqs.first_mut() {
            first.pin_for = Some(request_id.clone());
            meta.kv_params = Some(KvTransferParamsOut {
                do_remote_prefill: true,
                do_remote_decode: false,
                remote_block_ids: Vec::new(),
                remote_engine_id: st.engine_id.to_string(),
                remote_request_id: request_id,
                remote_host: st.host.clone(),
                remote_port: st.port,
                tp_size: st.tp_size,
                dcp_size: 1,
                pp_size: 1,
                remote_num_tokens: first.prompt.len() as u64,
                remote_blocks_expiry_time: None,
                transfer_mode: "pull".to_owned(),
            });
        }
    }
    Ok(st.engine.submit_with(seqs, received)?)
}

/// Turns a request into one engine sequence per (prompt, choice).
/// vLLM's `X-Vllm-Priority` (an integer; anything else, or none, is 0).
fn priority_of(headers: &HeaderMap) -> i32 {
    headers
        .get("x-vllm-priority")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn plan_sequences(
    req: &ParsedRequest<'_>,
    limits: &SchedulerConfig,
    priority: i32,
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
                hold_prefix: false,
                pin_for: None,
                priority,
            });
        }
    }
    Ok((seqs, lens))
}
