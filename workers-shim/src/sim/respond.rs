//! Turning a request's engine events into its HTTP response: one JSON body, or an SSE
//! stream in OpenAI's chunk format ending with `data: [DONE]`. Both carry OwnerServe's
//! report headers (prompt, cached and computed tokens, KV received and its transfer time),
//! and a prefill leg's JSON body carries vLLM's `kv_transfer_params` for its decode leg.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;

use super::agent_wire::{self, Counts, ResponseEcho, Sequence};
use super::engine::SeqEvent;
use super::http_error::{error_response, json_response, ErrorBody, ErrorDetail};
use super::kv_transfer::KvTransferParamsOut;
use super::response_store::ResponseStore;
use crate::openai::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, Chunk, Completion, Delta, FinishReason,
    TextChoice, TextChunkChoice, Usage, UsageField,
};
use crate::openai::{Endpoint, Message};

/// KV a request received before it was queued.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct TransferReport {
    pub(super) received_bytes: u64,
    /// Simulated seconds.
    pub(super) transfer_s: f64,
}

/// Everything a response needs to know besides the events.
pub(super) struct ResponseMeta {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: Arc<str>,
    pub(super) endpoint: Endpoint,
    pub(super) include_usage: bool,
    /// Choices per prompt.
    pub(super) n: u32,
    pub(super) prompt_lens: Vec<usize>,
    pub(super) transfer: TransferReport,
    /// Prefill leg: the params to return, `remote_block_ids` filled in once pinned.
    pub(super) kv_params: Option<KvTransferParamsOut>,
    /// A Responses answer's echo of its request, and where it is stored.
    pub(super) responses: Option<ResponsesMeta>,
}

/// What a Responses answer needs besides its text.
pub(super) struct ResponsesMeta {
    pub(super) echo: ResponseEcho,
    /// `store: true`: the store, and the conversation so far (the answer is appended).
    pub(super) store: Option<(Arc<ResponseStore>, Vec<Message<'static>>)>,
}

impl ResponseMeta {
    /// The Responses body of this answer in `status`, stored when asked for.
    fn response_body(&self, status: &str, text: Option<&str>, c: Counts) -> serde_json::Value {
        let echo = self
            .responses
            .as_ref()
            .map(|r| r.echo.clone())
            .unwrap_or_default();
        agent_wire::response_body(&self.id, self.created, &self.model, &echo, status, text, c)
    }

    /// The body of a background response just queued.
    pub(super) fn queued_body(&self, c: Counts) -> serde_json::Value {
        self.response_body("queued", None, c)
    }

    /// Keeps a finished Responses answer (body and conversation) when `store` asked for it.
    fn store_response(&self, body: &serde_json::Value, text: &str) {
        if let Some((store, conversation)) = self.responses.as_ref().and_then(|r| r.store.as_ref())
        {
            let mut conversation = conversation.clone();
            conversation.push(Message {
                role: std::borrow::Cow::Borrowed("assistant"),
                parts: vec![std::borrow::Cow::Owned(text.to_owned())],
            });
            store.put(&self.id, body.clone(), conversation);
        }
    }
}

/// A JSON body with vLLM's top-level `kv_transfer_params` next to the usual fields.
#[derive(Serialize)]
struct WithKvParams<'a, T> {
    #[serde(flatten)]
    body: T,
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_transfer_params: Option<&'a KvTransferParamsOut>,
}

/// Per-choice progress shared by the streaming and the collecting paths.
struct Accumulator {
    texts: Vec<String>,
    finish: Vec<Option<FinishReason>>,
    started: Vec<bool>,
    completion_tokens: u64,
    cached_tokens: u64,
    /// Prompts whose first choice was admitted.
    admitted_prompts: usize,
    /// Prefill leg: the pinned prompt blocks.
    block_ids: Option<Vec<u32>>,
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
            admitted_prompts: 0,
            block_ids: None,
            unfinished: choices,
            error: None,
        }
    }

    fn counts(&self, meta: &ResponseMeta) -> Counts {
        Counts {
            prompt: meta.prompt_lens.iter().sum::<usize>() as u64,
            cached: self.cached_tokens,
            completion: self.completion_tokens,
        }
    }

    fn usage(&self, meta: &ResponseMeta) -> Usage {
        let prompt: usize = meta.prompt_lens.iter().sum();
        Usage::new(prompt as u64, self.completion_tokens, self.cached_tokens)
    }

    /// OwnerServe's report headers: known once every prompt was admitted.
    fn report_headers(&self, meta: &ResponseMeta) -> Vec<(HeaderName, HeaderValue)> {
        let prompt: u64 = meta.prompt_lens.iter().map(|&l| l as u64).sum();
        let computed = prompt.saturating_sub(self.cached_tokens);
        let transfer_ms = format!("{:.3}", meta.transfer.transfer_s * 1e3);
        [
            ("x-ownerserve-prompt-tokens", prompt.to_string()),
            ("x-ownerserve-cached-tokens", self.cached_tokens.to_string()),
            ("x-ownerserve-computed-tokens", computed.to_string()),
            (
                crate::engines::KV_RECEIVED_BYTES_HEADER,
                meta.transfer.received_bytes.to_string(),
            ),
            ("x-ownerserve-kv-transfer-ms", transfer_ms),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            Some((
                HeaderName::from_static(name),
                HeaderValue::from_str(&value).ok()?,
            ))
        })
        .collect()
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
                    self.admitted_prompts += 1;
                }
                None
            }
            SeqEvent::Pinned { block_ids, .. } => {
                self.block_ids = Some(block_ids);
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

/// Waits for every choice to finish and answers with one JSON body.
pub(super) async fn collect(
    mut events: mpsc::UnboundedReceiver<SeqEvent>,
    meta: ResponseMeta,
) -> Response {
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
    let kv_params = meta.kv_params.clone().map(|mut p| {
        p.remote_block_ids = acc.block_ids.clone().unwrap_or_default();
        p
    });
    let kv_transfer_params = kv_params.as_ref();
    let text = acc.texts.first().map_or("", String::as_str);
    let mut response = match meta.endpoint {
        Endpoint::Messages | Endpoint::MessagesCountTokens => json_response(
            StatusCode::OK,
            &WithKvParams {
                kv_transfer_params,
                body: agent_wire::message_body(
                    &meta.id,
                    &meta.model,
                    text,
                    acc.finish.first().copied().flatten(),
                    acc.counts(&meta),
                ),
            },
        ),
        Endpoint::Responses => {
            let status = agent_wire::response_status(acc.finish.first().copied().flatten());
            let body = meta.response_body(status, Some(text), acc.counts(&meta));
            meta.store_response(&body, text);
            json_response(
                StatusCode::OK,
                &WithKvParams {
                    kv_transfer_params,
                    body,
                },
            )
        }
        Endpoint::ChatCompletions => json_response(
            StatusCode::OK,
            &WithKvParams {
                kv_transfer_params,
                body: Completion {
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
            },
        ),
        Endpoint::Completions => json_response(
            StatusCode::OK,
            &WithKvParams {
                kv_transfer_params,
                body: Completion {
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
            },
        ),
    };
    response.headers_mut().extend(acc.report_headers(&meta));
    response
}

/// Answers with an SSE stream once every prompt is admitted (the report headers need
/// the prefix-cache hit, known at admission; token events that arrive meanwhile are
/// queued as chunks).
pub(super) async fn stream(
    events: mpsc::UnboundedReceiver<SeqEvent>,
    meta: ResponseMeta,
) -> Response {
    let mut body = SseBody {
        events,
        state: Accumulator::new(&meta),
        meta,
        pending: VecDeque::new(),
        done: false,
        seq: Sequence::default(),
    };
    let prompts = body.meta.prompt_lens.len();
    while body.state.admitted_prompts < prompts && body.state.unfinished > 0 {
        match body.events.recv().await {
            Some(ev) => body.on_event(ev),
            None => break,
        }
    }
    let headers = body.state.report_headers(&body.meta);
    let mut response = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::new(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    response.headers_mut().extend(headers);
    response
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
    /// A Responses stream's event numbers.
    seq: Sequence,
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
            _ => "text_completion",
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
            Endpoint::Messages | Endpoint::MessagesCountTokens | Endpoint::Responses => {
                self.agent_started();
                if !text.is_empty() {
                    let delta = if self.meta.endpoint == Endpoint::Responses {
                        agent_wire::response_delta(&mut self.seq, &self.meta.id, &text)
                    } else {
                        agent_wire::message_delta(&text)
                    };
                    self.pending.push_back(delta);
                    if let Some(t) = self.state.texts.get_mut(choice as usize) {
                        t.push_str(&text);
                    }
                }
            }
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

    /// The opening events of an agent API's stream, once.
    fn agent_started(&mut self) {
        if std::mem::replace(&mut self.state.started[0], true) {
            return;
        }
        let counts = self.state.counts(&self.meta);
        let opening = if self.meta.endpoint == Endpoint::Responses {
            let body = self.meta.response_body("in_progress", None, counts);
            agent_wire::response_start(&mut self.seq, &body)
        } else {
            agent_wire::message_start(&self.meta.id, &self.meta.model, counts)
        };
        self.pending.extend(opening);
    }

    /// The closing events of an agent API's stream (no `[DONE]`: neither API has one).
    fn on_agent_end(&mut self, error: Option<String>) {
        self.done = true;
        let responses = self.meta.endpoint == Endpoint::Responses;
        if let Some(err) = error {
            let event = if responses {
                agent_wire::response_error(&mut self.seq, &err)
            } else {
                agent_wire::message_error(&err)
            };
            self.pending.push_back(event);
            return;
        }
        self.agent_started();
        let counts = self.state.counts(&self.meta);
        let finish = self.state.finish.first().copied().flatten();
        let text = self.state.texts.first().cloned().unwrap_or_default();
        let closing = if responses {
            let body =
                self.meta
                    .response_body(agent_wire::response_status(finish), Some(&text), counts);
            self.meta.store_response(&body, &text);
            agent_wire::response_end(&mut self.seq, &body, &text)
        } else {
            agent_wire::message_end(finish, counts)
        };
        self.pending.extend(closing);
    }

    fn on_end(&mut self) {
        if !self.meta.endpoint.disaggregable() {
            let error = self.state.error.take().or_else(|| {
                (self.state.unfinished > 0)
                    .then(|| "the engine stopped before the request finished".to_owned())
            });
            return self.on_agent_end(error);
        }
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
