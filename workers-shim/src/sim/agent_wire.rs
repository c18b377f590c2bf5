//! The simulated engine's answers on the coding agents' APIs, in their exact shapes:
//! Anthropic Messages (a `message` body; SSE `message_start`, `content_block_start`,
//! `ping`, `content_block_delta`…, `content_block_stop`, `message_delta`, `message_stop`)
//! and OpenAI Responses (a `response` body; SSE `response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed` or
//! `response.incomplete`, each with its `sequence_number`).

use bytes::Bytes;
use serde_json::{json, Value};

use crate::openai::response::FinishReason;

/// Token counts of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) prompt: u64,
    pub(super) cached: u64,
    pub(super) completion: u64,
}

/// What a Responses answer echoes of its request.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ResponseEcho {
    pub(super) previous_response_id: Option<String>,
    pub(super) store: bool,
    pub(super) background: bool,
    pub(super) max_output_tokens: Option<u32>,
    pub(super) temperature: f64,
    pub(super) top_p: f64,
}

/// One named SSE event: `event: <type>` and its JSON.
pub(super) fn named_event(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

fn anthropic_usage(c: Counts) -> Value {
    json!({
        "input_tokens": c.prompt.saturating_sub(c.cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": c.cached,
        "output_tokens": c.completion,
    })
}

fn stop_reason(finish: Option<FinishReason>) -> &'static str {
    match finish {
        Some(FinishReason::Length) => "max_tokens",
        _ => "end_turn",
    }
}

/// A whole Anthropic `message`.
pub(super) fn message_body(
    id: &str,
    model: &str,
    text: &str,
    finish: Option<FinishReason>,
    c: Counts,
) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason(finish), "stop_sequence": null,
        "usage": anthropic_usage(c),
    })
}

/// The events opening a Messages stream: the message, its text block and a ping.
pub(super) fn message_start(id: &str, model: &str, c: Counts) -> Vec<Bytes> {
    let usage = anthropic_usage(Counts { completion: 0, ..c });
    vec![
        named_event(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
            }}),
        ),
        named_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
        named_event("ping", &json!({"type": "ping"})),
    ]
}

pub(super) fn message_delta(text: &str) -> Bytes {
    named_event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}),
    )
}

/// The events closing a Messages stream.
pub(super) fn message_end(finish: Option<FinishReason>, c: Counts) -> Vec<Bytes> {
    vec![
        named_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        named_event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(finish), "stop_sequence": null},
                    "usage": {"output_tokens": c.completion}}),
        ),
        named_event("message_stop", &json!({"type": "message_stop"})),
    ]
}

/// An Anthropic error event, for a stream that fails after it started.
pub(super) fn message_error(message: &str) -> Bytes {
    named_event(
        "error",
        &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
    )
}

/// The id of a Responses answer's one output message.
pub(super) fn item_id(response_id: &str) -> String {
    format!("msg_{}", response_id.trim_start_matches("resp_"))
}

fn output_item(response_id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": item_id(response_id), "type": "message", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

/// A whole `response` object in `status`; `text` is `None` while nothing is generated.
pub(super) fn response_body(
    id: &str,
    created: u64,
    model: &str,
    echo: &ResponseEcho,
    status: &str,
    text: Option<&str>,
    c: Counts,
) -> Value {
    let output: Vec<Value> = text
        .map(|t| output_item(id, t, "completed"))
        .into_iter()
        .collect();
    let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    json!({
        "id": id, "object": "response", "created_at": created, "status": status,
        "model": model, "output": output,
        "error": null, "incomplete_details": incomplete, "instructions": null, "metadata": {},
        "parallel_tool_calls": true, "temperature": echo.temperature, "top_p": echo.top_p,
        "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
        "truncation": "disabled", "max_output_tokens": echo.max_output_tokens,
        "previous_response_id": echo.previous_response_id, "store": echo.store,
        "background": echo.background,
        "usage": {
            "input_tokens": c.prompt, "input_tokens_details": {"cached_tokens": c.cached},
            "output_tokens": c.completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.prompt + c.completion,
        },
    })
}

/// The final status of a Responses answer that ended with `finish`.
pub(super) fn response_status(finish: Option<FinishReason>) -> &'static str {
    match finish {
        Some(FinishReason::Length) => "incomplete",
        _ => "completed",
    }
}

/// Numbers a Responses stream's events.
#[derive(Debug, Default)]
pub(super) struct Sequence(u64);

impl Sequence {
    /// The event `kind` with `fields`, `type` and the next `sequence_number` added.
    pub(super) fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = Value::from(kind);
        fields["sequence_number"] = Value::from(self.0);
        self.0 += 1;
        named_event(kind, &fields)
    }
}

/// The events opening a Responses stream, `in_progress` holding the response so far.
pub(super) fn response_start(seq: &mut Sequence, in_progress: &Value) -> Vec<Bytes> {
    let id = in_progress["id"].as_str().unwrap_or_default();
    let item = json!({"id": item_id(id), "type": "message", "status": "in_progress",
                      "role": "assistant", "content": []});
    vec![
        seq.event("response.created", json!({"response": in_progress})),
        seq.event("response.in_progress", json!({"response": in_progress})),
        seq.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ),
        seq.event(
            "response.content_part.added",
            json!({"item_id": item_id(id), "output_index": 0, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
        ),
    ]
}

pub(super) fn response_delta(seq: &mut Sequence, id: &str, text: &str) -> Bytes {
    seq.event(
        "response.output_text.delta",
        json!({"item_id": item_id(id), "output_index": 0, "content_index": 0,
               "delta": text, "logprobs": []}),
    )
}

/// The events closing a Responses stream, `done` being the final response.
pub(super) fn response_end(seq: &mut Sequence, done: &Value, text: &str) -> Vec<Bytes> {
    let id = done["id"].as_str().unwrap_or_default();
    let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    let last = if done["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    vec![
        seq.event(
            "response.output_text.done",
            json!({"item_id": item_id(id), "output_index": 0, "content_index": 0,
                   "text": text, "logprobs": []}),
        ),
        seq.event(
            "response.content_part.done",
            json!({"item_id": item_id(id), "output_index": 0, "content_index": 0, "part": part}),
        ),
        seq.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": output_item(id, text, "completed")}),
        ),
        seq.event(last, json!({"response": done})),
    ]
}

/// A Responses `error` event, for a stream that fails after it started.
pub(super) fn response_error(seq: &mut Sequence, message: &str) -> Bytes {
    seq.event(
        "error",
        json!({"code": "server_error", "message": message, "param": null}),
    )
}
