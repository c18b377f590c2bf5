//! Parsing and validating OpenAI request bodies.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::conversation::{content_type_error, Text};
pub use super::conversation::{Message, RequestError, TemplateInput};
use ownerserve_planner::tokenized::Tokenized;
use ownerserve_planner::tokenizer::{self, TemplateMessage};

/// Which endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    /// Anthropic Messages (`/v1/messages`), what Claude Code speaks.
    Messages,
    /// Anthropic's token count of a Messages body (no `max_tokens` needed).
    MessagesCountTokens,
    /// OpenAI Responses (`/v1/responses`), what Codex speaks.
    Responses,
}

impl Endpoint {
    /// The endpoint's path, the same on every OpenAI-compatible server.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Messages => "/v1/messages",
            Endpoint::MessagesCountTokens => "/v1/messages/count_tokens",
            Endpoint::Responses => "/v1/responses",
        }
    }

    /// Whether an engine's disaggregated legs (`kv_transfer_params` prefill/decode
    /// bodies) are defined for this endpoint: vLLM's NIXL two-step and SGLang's bootstrap
    /// pair are chat and completions protocols; the agents' APIs run whole on one worker.
    pub fn disaggregable(self) -> bool {
        matches!(self, Endpoint::ChatCompletions | Endpoint::Completions)
    }

    /// The Anthropic Messages API (its errors and SSE events have Anthropic's shapes).
    pub fn is_anthropic(self) -> bool {
        matches!(self, Endpoint::Messages | Endpoint::MessagesCountTokens)
    }
}

/// Sampling parameters the engine honours.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// `max_completion_tokens`, else `max_tokens`; `None` lets the model stop on its own.
    pub max_tokens: Option<u32>,
    pub n: u32,
    pub temperature: f64,
    pub top_p: f64,
    pub stop: Vec<String>,
    /// vLLM extension: keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    pub seed: Option<u64>,
}

/// One completions prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput<'a> {
    Text(Cow<'a, str>),
    Tokens(Vec<u32>),
}

/// The prompt part of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt<'a> {
    Chat(Vec<Message<'a>>),
    /// A batch of prompts; each gets `n` choices.
    Completion(Vec<PromptInput<'a>>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest<'a> {
    pub model: Cow<'a, str>,
    pub prompt: Prompt<'a>,
    pub sampling: Sampling,
    pub stream: bool,
    pub include_usage: bool,
    /// OpenAI `user`.
    pub user: Option<Cow<'a, str>>,
    /// `metadata.session_id`.
    pub session_id: Option<Cow<'a, str>>,
    /// vLLM's KV-connector extension (`kv_transfer_params`), as raw JSON text: only an
    /// engine interprets it, and a JSON `null` counts as absent.
    pub kv_transfer_params: Option<&'a str>,
    /// The first field present that steers an engine's disaggregated serving
    /// (`kv_transfer_params`, SGLang's `bootstrap_host`/`_port`/`_room`): a router sets
    /// these on its own legs and refuses them from clients.
    pub engine_control: Option<&'static str>,
    /// What a model's own chat template renders: `messages` and `tools` as the client sent
    /// them (raw JSON; `tools` absent when null), and vLLM's `add_generation_prompt`
    /// (default true). A Messages or Responses body's conversation is converted to chat
    /// messages and tools first, as an engine renders it.
    pub template: TemplateInput<'a>,
    /// Responses: the stored response this one continues.
    pub previous_response_id: Option<Cow<'a, str>>,
    /// Responses: keep the response for a follow-up, `GET` or `cancel` (default true).
    pub store: bool,
    /// Responses: answer at once and run in the background (needs `store`).
    pub background: bool,
    /// Responses: the client's prompt-cache key (Codex sends its thread id).
    pub prompt_cache_key: Option<Cow<'a, str>>,
    /// Messages: `metadata.user_id` as sent (Claude Code names its session in it; the
    /// router's identity reads it).
    pub metadata_user_id: Option<Cow<'a, str>>,
    /// Dynamo's `nvext.session_control`, for clients written for Dynamo.
    pub session_control: Option<SessionControl<'a>>,
    /// vLLM's `priority` extension (lower runs sooner): the router reads it as an
    /// admission class and sets the engine's priority itself.
    pub priority: Option<i64>,
    /// OpenAI's `service_tier` (`auto`, `default`, `flex`, `priority`, ...).
    pub service_tier: Option<Cow<'a, str>>,
}

/// What a client asks of its session's life (Dynamo's `nvext.session_control`, or the
/// router's `x-ownerserve-session-control` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionControl<'a> {
    pub session_id: Option<Cow<'a, str>>,
    pub action: SessionAction,
    /// Seconds the session is kept alive for (`bind`/`open`; Dynamo's default 300).
    pub timeout_s: u64,
}

/// Dynamo's session actions: `open` and `bind` keep the session alive (the router keeps
/// its KV as for a session sure to return), `close` ends it once the response ends, none
/// continues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAction {
    Continue,
    KeepAlive,
    Close,
}

impl SessionAction {
    /// `open`, `bind` and `keep-alive` keep alive, `close` closes; anything else is `None`.
    pub fn parse(action: &str) -> Option<Self> {
        match action {
            "open" | "bind" | "keep-alive" | "keep_alive" => Some(Self::KeepAlive),
            "close" => Some(Self::Close),
            _ => None,
        }
    }
}

/// Dynamo's default keep-alive, seconds.
pub const SESSION_TIMEOUT_S: u64 = 300;

fn session_control<'a>(
    raw: Option<&'a RawValue>,
) -> Result<Option<SessionControl<'a>>, RequestError> {
    let Some(nvext) = field::<RawNvext<'a>>(raw, "nvext")? else {
        return Ok(None);
    };
    let Some(c) = nvext.session_control else {
        return Ok(None);
    };
    let action = match c.action.as_ref().map(|a| a.0.as_ref()) {
        None => SessionAction::Continue,
        Some(a) => SessionAction::parse(a).ok_or_else(|| {
            RequestError::invalid(
                "nvext.session_control.action",
                "'nvext.session_control.action' must be 'open', 'bind' or 'close'",
            )
        })?,
    };
    Ok(Some(SessionControl {
        session_id: c.session_id.map(|s| s.0).filter(|s| !s.is_empty()),
        action,
        timeout_s: c.timeout.unwrap_or(SESSION_TIMEOUT_S),
    }))
}

const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];
/// Most choices per prompt we accept (vLLM has no hard cap; OpenAI caps at 128).
pub const MAX_N: u32 = 128;
/// Most stop strings we accept.
pub const MAX_STOP: usize = 16;

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    n: Option<&'a RawValue>,
    #[serde(borrow, default)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow, default)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    ignore_eos: Option<&'a RawValue>,
    #[serde(borrow, default)]
    seed: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kv_transfer_params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    bootstrap_host: Option<&'a RawValue>,
    #[serde(borrow, default)]
    bootstrap_port: Option<&'a RawValue>,
    #[serde(borrow, default)]
    bootstrap_room: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    add_generation_prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop_sequences: Option<&'a RawValue>,
    #[serde(borrow, default)]
    store: Option<&'a RawValue>,
    #[serde(borrow, default)]
    background: Option<&'a RawValue>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    nvext: Option<&'a RawValue>,
    #[serde(borrow, default)]
    priority: Option<&'a RawValue>,
    #[serde(borrow, default)]
    service_tier: Option<&'a RawValue>,
}

/// Dynamo's request extension, of which the router reads `session_control`.
#[derive(Deserialize)]
struct RawNvext<'a> {
    #[serde(borrow, default)]
    session_control: Option<RawSessionControl<'a>>,
}

#[derive(Deserialize)]
struct RawSessionControl<'a> {
    #[serde(borrow, default)]
    session_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    action: Option<Text<'a>>,
    #[serde(default)]
    timeout: Option<u64>,
}

#[derive(Deserialize)]
struct RawMetadata<'a> {
    #[serde(borrow, default)]
    session_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    user_id: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<RawContent<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<RawToolCall<'a>>>,
}

/// A message's `content` as the list is parsed: a string is read in that same pass (an
/// agent's long prompt is scanned once here, not once to find its end and again to read
/// it); parts are kept raw and read one by one; anything else is an error for
/// [`parse_message`] to report with the message's index.
enum RawContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<&'a RawValue>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for RawContent<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = RawContent<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(RawContent::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawContent::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(RawContent::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element::<&'de RawValue>()? {
                    parts.push(part);
                }
                Ok(RawContent::Parts(parts))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(RawContent::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(RawContent::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(RawContent::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(RawContent::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(RawContent::Other)
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct RawPart<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawToolCall<'a> {
    #[serde(borrow)]
    function: RawFunction<'a>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Cow<'a, str>,
}

#[derive(Deserialize)]
struct RawStreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

pub(crate) fn field<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    param: &str,
) -> Result<Option<T>, RequestError> {
    match raw {
        None => Ok(None),
        Some(v) => serde_json::from_str(v.get())
            .map(Some)
            .map_err(|e| RequestError::wrong_type(param, &e)),
    }
}

/// Parses and validates a request body sent to `endpoint`.
pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<ParsedRequest<'_>, RequestError> {
    let not_object = |detail: String| RequestError {
        message: format!("request body is not a valid JSON object: {detail}"),
        param: None,
        code: "invalid_json",
    };
    // serde would also fill a struct from a JSON array, positionally; OpenAI bodies are objects.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(not_object("expected '{'".to_owned()));
    }
    let raw: RawBody<'_> = serde_json::from_slice(body).map_err(|e| not_object(e.to_string()))?;
    let model: Cow<'_, str> =
        field(raw.model, "model")?.ok_or_else(|| RequestError::missing("model"))?;
    if model.is_empty() {
        return Err(RequestError::invalid("model", "'model' must not be empty"));
    }
    let (prompt, template) = match endpoint {
        Endpoint::ChatCompletions => {
            let messages = parse_messages(
                raw.messages
                    .ok_or_else(|| RequestError::missing("messages"))?,
            )?;
            let template = TemplateInput {
                messages_json: raw.messages.map(|v| Cow::Borrowed(v.get())),
                tools_json: raw
                    .tools
                    .map(RawValue::get)
                    .filter(|v| *v != "null")
                    .map(Cow::Borrowed),
                add_generation_prompt: field(raw.add_generation_prompt, "add_generation_prompt")?
                    .unwrap_or(true),
            };
            (Prompt::Chat(messages), template)
        }
        Endpoint::Completions => (
            Prompt::Completion(parse_prompt(
                raw.prompt.ok_or_else(|| RequestError::missing("prompt"))?,
            )?),
            TemplateInput::default(),
        ),
        Endpoint::Messages | Endpoint::MessagesCountTokens => {
            let c = super::messages::convert(
                raw.system,
                raw.messages
                    .ok_or_else(|| RequestError::missing("messages"))?,
                raw.tools,
            )?;
            (Prompt::Chat(c.messages), c.template)
        }
        Endpoint::Responses => {
            let c = super::responses::convert(
                raw.instructions,
                raw.input.ok_or_else(|| RequestError::missing("input"))?,
                raw.tools,
            )?;
            (Prompt::Chat(c.messages), c.template)
        }
    };
    let stream: bool = field(raw.stream, "stream")?.unwrap_or(false);
    let agent_api = !endpoint.disaggregable();
    // The Responses API has `stream_options` of its own; chat's may come only with a stream.
    let options: Option<RawStreamOptions> = if agent_api {
        None
    } else {
        field(raw.stream_options, "stream_options")?
    };
    if options.is_some() && !stream {
        return Err(RequestError::invalid(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true",
        ));
    }
    let user: Option<Text<'_>> = field(raw.user, "user")?;
    let metadata: Option<RawMetadata<'_>> = field(raw.metadata, "metadata")?;
    let (session_id, metadata_user_id) = match metadata {
        Some(m) => (m.session_id.map(|s| s.0), m.user_id.map(|s| s.0)),
        None => (None, None),
    };
    let responses = endpoint == Endpoint::Responses;
    let store: bool = field(raw.store, "store")?.unwrap_or(responses);
    let background: bool = field(raw.background, "background")?.unwrap_or(false);
    if background && !store {
        return Err(RequestError::invalid(
            "background",
            "background mode needs 'store': true",
        ));
    }
    let previous_response_id: Option<Text<'_>> =
        field(raw.previous_response_id, "previous_response_id")?;
    if previous_response_id
        .as_ref()
        .is_some_and(|p| p.0.is_empty())
    {
        return Err(RequestError::invalid(
            "previous_response_id",
            "'previous_response_id' must not be empty",
        ));
    }
    let prompt_cache_key: Option<Text<'_>> = field(raw.prompt_cache_key, "prompt_cache_key")?;
    Ok(ParsedRequest {
        model,
        prompt,
        sampling: parse_sampling(&raw, endpoint)?,
        stream,
        include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
        user: user.map(|u| u.0),
        session_id,
        kv_transfer_params: raw
            .kv_transfer_params
            .map(RawValue::get)
            .filter(|v| *v != "null"),
        engine_control: [
            ("kv_transfer_params", raw.kv_transfer_params),
            ("bootstrap_host", raw.bootstrap_host),
            ("bootstrap_port", raw.bootstrap_port),
            ("bootstrap_room", raw.bootstrap_room),
        ]
        .into_iter()
        .find(|(_, v)| v.is_some())
        .map(|(k, _)| k),
        template,
        previous_response_id: previous_response_id.map(|p| p.0),
        store: store && responses,
        background,
        prompt_cache_key: prompt_cache_key.map(|p| p.0),
        metadata_user_id,
        session_control: session_control(raw.nvext)?,
        priority: field(raw.priority, "priority")?,
        service_tier: field::<Text<'_>>(raw.service_tier, "service_tier")?.map(|t| t.0),
    })
}

fn parse_sampling(raw: &RawBody<'_>, endpoint: Endpoint) -> Result<Sampling, RequestError> {
    let max_tokens = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Completions => {
            match field::<i64>(raw.max_completion_tokens, "max_completion_tokens")? {
                Some(v) => Some(("max_completion_tokens", v)),
                None => field::<i64>(raw.max_tokens, "max_tokens")?.map(|v| ("max_tokens", v)),
            }
        }
        // Anthropic requires `max_tokens` on a Messages request.
        Endpoint::Messages => Some((
            "max_tokens",
            field::<i64>(raw.max_tokens, "max_tokens")?
                .ok_or_else(|| RequestError::missing("max_tokens"))?,
        )),
        Endpoint::MessagesCountTokens => None,
        Endpoint::Responses => field::<i64>(raw.max_output_tokens, "max_output_tokens")?
            .map(|v| ("max_output_tokens", v)),
    };
    let max_tokens = match max_tokens {
        Some((param, v)) if !(1..=i64::from(u32::MAX)).contains(&v) => {
            return Err(RequestError::invalid(
                param,
                format!("'{param}' must be at least 1, got {v}"),
            ))
        }
        Some((_, v)) => Some(v as u32),
        None => None,
    };
    // `n` is chat's and completions'; the agents' APIs generate one answer.
    let n: i64 = if endpoint.disaggregable() {
        field(raw.n, "n")?.unwrap_or(1)
    } else {
        1
    };
    if !(1..=i64::from(MAX_N)).contains(&n) {
        return Err(RequestError::invalid(
            "n",
            format!("'n' must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let temperature: f64 = field(raw.temperature, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(RequestError::invalid(
            "temperature",
            format!("'temperature' must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p: f64 = field(raw.top_p, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(RequestError::invalid(
            "top_p",
            format!("'top_p' must be in (0, 1], got {top_p}"),
        ));
    }
    Ok(Sampling {
        max_tokens,
        n: n as u32,
        temperature,
        top_p,
        stop: match endpoint {
            Endpoint::Messages | Endpoint::MessagesCountTokens => {
                parse_stop(raw.stop_sequences, "stop_sequences")?
            }
            Endpoint::Responses => Vec::new(),
            _ => parse_stop(raw.stop, "stop")?,
        },
        ignore_eos: field(raw.ignore_eos, "ignore_eos")?.unwrap_or(false),
        seed: field::<i64>(raw.seed, "seed")?.map(|s| s as u64),
    })
}

fn parse_stop(raw: Option<&RawValue>, param: &str) -> Result<Vec<String>, RequestError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stop {
        One(String),
        Many(Vec<String>),
    }
    let stop = match field::<Option<Stop>>(raw, param)?.flatten() {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOP {
        return Err(RequestError::invalid(
            param,
            format!(
                "at most {MAX_STOP} stop sequences are allowed, got {}",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(RequestError::invalid(
            param,
            "stop sequences must not be empty",
        ));
    }
    Ok(stop)
}

fn parse_messages(raw: &RawValue) -> Result<Vec<Message<'_>>, RequestError> {
    let list: Vec<RawMessage<'_>> =
        serde_json::from_str(raw.get()).map_err(|e| RequestError::wrong_type("messages", &e))?;
    if list.is_empty() {
        return Err(RequestError::invalid(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

fn parse_message(i: usize, m: RawMessage<'_>) -> Result<Message<'_>, RequestError> {
    if !ROLES.contains(&m.role.as_ref()) {
        return Err(RequestError::invalid(
            format!("messages[{i}].role"),
            format!(
                "unknown role '{}' (expected one of: {})",
                m.role,
                ROLES.join(", ")
            ),
        ));
    }
    let param = || format!("messages[{i}].content");
    let mut parts = Vec::new();
    match m.content {
        Some(RawContent::Text(text)) => parts.push(text),
        Some(RawContent::Parts(list)) => {
            for raw in list {
                let part: RawPart<'_> = serde_json::from_str(raw.get())
                    .map_err(|e| RequestError::wrong_type(&param(), &e))?;
                match (part.kind.as_ref(), part.text) {
                    ("text", Some(text)) => parts.push(text),
                    ("text", None) => {
                        return Err(RequestError::invalid(
                            param(),
                            "a 'text' content part needs a 'text' string",
                        ))
                    }
                    // Images, audio, files: routed as-is; they add no text to the prompt.
                    _ => {}
                }
            }
        }
        Some(RawContent::Other) => return Err(content_type_error(param())),
        None => {}
    }
    for call in m.tool_calls.unwrap_or_default() {
        let f = call.function;
        parts.push(Cow::Owned(format!(
            "<tool_call>{}({})</tool_call>",
            f.name, f.arguments
        )));
    }
    Ok(Message {
        role: m.role,
        parts,
    })
}

fn parse_prompt(raw: &RawValue) -> Result<Vec<PromptInput<'_>>, RequestError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw<'a> {
        #[serde(borrow)]
        Text(Cow<'a, str>),
        Texts(Vec<Cow<'a, str>>),
        Tokens(Vec<u32>),
        TokenLists(Vec<Vec<u32>>),
    }
    let parsed: Raw<'_> = serde_json::from_str(raw.get()).map_err(|_| RequestError {
        message: "invalid type for 'prompt': expected a string, an array of strings, an array \
                  of token ids or an array of token-id arrays"
            .to_owned(),
        param: Some("prompt".to_owned()),
        code: "invalid_type",
    })?;
    let prompts = match parsed {
        Raw::Text(t) => vec![PromptInput::Text(t)],
        Raw::Texts(v) => v.into_iter().map(PromptInput::Text).collect(),
        Raw::Tokens(v) => vec![PromptInput::Tokens(v)],
        Raw::TokenLists(v) => v.into_iter().map(PromptInput::Tokens).collect(),
    };
    let empty_tokens = prompts
        .iter()
        .any(|p| matches!(p, PromptInput::Tokens(t) if t.is_empty()));
    if prompts.is_empty() || empty_tokens {
        return Err(RequestError::invalid(
            "prompt",
            "'prompt' must not be empty",
        ));
    }
    Ok(prompts)
}

/// One prompt as the engine sees it, owned: chat messages rendered through the template,
/// or a completions prompt. Owning it lets a long prompt be tokenized off the request's
/// thread.
#[derive(Debug, Clone, PartialEq)]
pub enum RenderedPrompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl RenderedPrompt {
    /// Bytes of text to tokenize (0 for a prompt given as token ids).
    pub fn text_len(&self) -> usize {
        match self {
            RenderedPrompt::Text(t) => t.len(),
            RenderedPrompt::Tokens(_) => 0,
        }
    }

    /// Token ids through the built-in tokenizer.
    pub fn into_tokens(self) -> Vec<u32> {
        match self {
            RenderedPrompt::Text(t) => tokenizer::encode(&t),
            RenderedPrompt::Tokens(t) => t,
        }
    }

    /// Tokenized, kept with its text; text that extends `prev`'s is tokenized only from
    /// near where the two differ.
    /// An owned `prev` is extended in place ([`Tokenized::after`]).
    pub fn into_tokenized(self, prev: Option<Cow<'_, Tokenized>>) -> Tokenized {
        match (self, prev) {
            (RenderedPrompt::Text(t), Some(prev)) => Tokenized::after(prev, t),
            (RenderedPrompt::Text(t), None) => Tokenized::new(t),
            (RenderedPrompt::Tokens(t), Some(prev)) => Tokenized::from_tokens(t).reusing(&prev),
            (RenderedPrompt::Tokens(t), None) => Tokenized::from_tokens(t),
        }
    }
}

impl ParsedRequest<'_> {
    /// Prompts in the request (a completions batch has several; chat has one).
    pub fn prompt_count(&self) -> usize {
        match &self.prompt {
            Prompt::Chat(_) => 1,
            Prompt::Completion(p) => p.len(),
        }
    }

    /// Choices the engines will generate: `n` for every prompt.
    pub fn choices(&self) -> u64 {
        self.prompt_count() as u64 * u64::from(self.sampling.n.max(1))
    }

    /// Each prompt rendered for tokenizing (chat messages through the chat template).
    pub fn rendered_prompts(&self) -> Vec<RenderedPrompt> {
        match &self.prompt {
            Prompt::Chat(messages) => {
                let parts: Vec<Vec<&str>> = messages
                    .iter()
                    .map(|m| m.parts.iter().map(|p| p.as_ref()).collect())
                    .collect();
                let template: Vec<TemplateMessage<'_>> = messages
                    .iter()
                    .zip(&parts)
                    .map(|(m, p)| TemplateMessage {
                        role: &m.role,
                        parts: p,
                    })
                    .collect();
                let mut text = String::new();
                tokenizer::render_chat(&template, &mut text);
                vec![RenderedPrompt::Text(text)]
            }
            Prompt::Completion(prompts) => prompts
                .iter()
                .map(|p| match p {
                    PromptInput::Text(t) => RenderedPrompt::Text(t.to_string()),
                    PromptInput::Tokens(t) => RenderedPrompt::Tokens(t.clone()),
                })
                .collect(),
        }
    }

    /// Token ids of each prompt, through the built-in tokenizer and chat template.
    pub fn prompt_tokens(&self) -> Vec<Vec<u32>> {
        self.rendered_prompts()
            .into_iter()
            .map(RenderedPrompt::into_tokens)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ParsedRequest<'_>, RequestError> {
        parse(body.as_bytes(), Endpoint::ChatCompletions)
    }

    #[test]
    fn parses_a_full_chat_request() {
        let req = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
               {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]},
               {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"ls","arguments":"{}"}}]}],
               "max_tokens":5,"n":2,"temperature":0,"stop":"\n","stream":true,
               "stream_options":{"include_usage":true},"unknown_field":[1,2]}"#,
        )
        .unwrap();
        assert_eq!(req.model, "m");
        assert!(req.stream && req.include_usage);
        assert_eq!(req.sampling.max_tokens, Some(5));
        assert_eq!(req.sampling.n, 2);
        assert_eq!(req.sampling.stop, vec!["\n".to_owned()]);
        let Prompt::Chat(m) = &req.prompt else {
            panic!()
        };
        assert_eq!(m[1].parts, vec![Cow::Borrowed("hi")]);
        assert_eq!(
            m[2].parts,
            vec![Cow::<str>::Owned("<tool_call>ls({})</tool_call>".into())]
        );
        assert!(
            matches!(m[0].parts[0], Cow::Borrowed(_)),
            "text is not copied"
        );
    }

    #[test]
    fn dynamos_session_control_is_read_and_a_bad_action_refused() {
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"session_control":{"session_id":"sub-1","action":"close"}}}"#).unwrap();
        let c = req.session_control.unwrap();
        assert_eq!(
            (c.session_id.as_deref(), c.action, c.timeout_s),
            (Some("sub-1"), SessionAction::Close, 300)
        );
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"session_control":{"session_id":"s","action":"bind","timeout":60}}}"#).unwrap();
        let c = req.session_control.unwrap();
        assert_eq!((c.action, c.timeout_s), (SessionAction::KeepAlive, 60));
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"session_control":{"session_id":"s"}}}"#).unwrap();
        assert_eq!(req.session_control.unwrap().action, SessionAction::Continue);
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"agent_hints":{}}}"#).unwrap();
        assert!(req.session_control.is_none());
        let bad = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"nvext":{"session_control":{"action":"explode"}}}"#).unwrap_err();
        assert!(
            bad.to_string()
                .contains("must be 'open', 'bind' or 'close'"),
            "{bad}"
        );
    }

    #[test]
    fn session_hints_are_read() {
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u1","metadata":{"session_id":"s1","other":3}}"#).unwrap();
        assert_eq!(req.user.as_deref(), Some("u1"));
        assert_eq!(req.session_id.as_deref(), Some("s1"));
        assert_eq!(req.kv_transfer_params, None);
        assert!(
            chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":[1]}"#)
                .is_err()
        );
    }

    #[test]
    fn kv_transfer_params_are_kept_raw_and_null_is_absent() {
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_decode":true}}"#).unwrap();
        assert_eq!(req.kv_transfer_params, Some(r#"{"do_remote_decode":true}"#));
        let req = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"kv_transfer_params":null}"#,
        )
        .unwrap();
        assert_eq!(req.kv_transfer_params, None);
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"max_completion_tokens":3}"#).unwrap();
        assert_eq!(req.sampling.max_tokens, Some(3));
    }

    #[test]
    fn rejects_bad_input_with_the_offending_param() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            ("not json", None, "invalid_json"),
            ("[1,2]", None, "invalid_json"),
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
                "missing_required_parameter",
            ),
            (
                r#"{"model":7,"messages":[]}"#,
                Some("model"),
                "invalid_type",
            ),
            (
                r#"{"model":"m"}"#,
                Some("messages"),
                "missing_required_parameter",
            ),
            (
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":"hi"}"#,
                Some("messages"),
                "invalid_type",
            ),
            (
                r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#,
                Some("messages[0].role"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages[0].content"),
                "invalid_type",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                Some("max_tokens"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}"#,
                Some("max_tokens"),
                "invalid_type",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}"#,
                Some("n"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                Some("temperature"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                Some("stream"),
                "invalid_type",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
                Some("stream_options"),
                "invalid_value",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[""]}"#,
                Some("stop"),
                "invalid_value",
            ),
        ];
        for (body, param, code) in cases {
            let err = chat(body).expect_err(body);
            assert_eq!(err.param.as_deref(), *param, "{body}: {err}");
            assert_eq!(err.code, *code, "{body}: {err}");
            assert!(!err.message.contains(" at line "), "{}", err.message);
        }
    }

    #[test]
    fn completions_accept_every_prompt_shape() {
        let p = |prompt: &str| {
            let body = format!(r#"{{"model":"m","prompt":{prompt}}}"#);
            parse(body.as_bytes(), Endpoint::Completions).map(|r| r.prompt_tokens().len())
        };
        assert_eq!(p(r#""hello""#), Ok(1));
        assert_eq!(p(r#"["a","b"]"#), Ok(2));
        assert_eq!(p("[1,2,3]"), Ok(1));
        assert_eq!(p("[[1,2],[3]]"), Ok(2));
        assert_eq!(p("[]").unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(p("{}").unwrap_err().code, "invalid_type");
    }

    #[test]
    fn chat_prompt_tokens_follow_the_template() {
        let req = chat(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(
            req.prompt_tokens(),
            vec![tokenizer::encode("<|user|>\nhi\n<|assistant|>\n")]
        );
    }
}
