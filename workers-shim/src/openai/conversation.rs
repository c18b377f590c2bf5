//! The chat conversation every request body becomes: its messages with their text
//! borrowed from the body, what a model's chat template renders, and the error a body that
//! cannot be accepted gets. Chat parses into it directly (`request`); Anthropic Messages
//! (`messages`) and OpenAI Responses (`responses`) bodies convert into it, so routing, the
//! planner and the engines see one shape whatever API a client spoke.

use std::borrow::Cow;

use serde::Deserialize;

/// A request body that is not acceptable; becomes a 400 with OpenAI's error shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub message: String,
    /// The offending field (`messages[2].role`), when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`invalid_json`, `missing_required_parameter`, ...).
    pub code: &'static str,
}

impl RequestError {
    pub(crate) fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param.into()),
            code: "invalid_value",
        }
    }

    /// The prompt and the tokens asked for exceed the model's context (vLLM's own message
    /// and OpenAI's code), found before any engine spends work on it.
    pub fn context_length(limit: u32, prompt: usize, completion: u32) -> Self {
        Self {
            message: format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
                prompt + completion as usize
            ),
            param: Some("messages".into()),
            code: "context_length_exceeded",
        }
    }

    /// More choices (`n` × prompts) than one request may ask for.
    pub fn too_many_choices(choices: u64, limit: u64) -> Self {
        Self::invalid(
            "n",
            format!("this request asks for {choices} choices (n × prompts); at most {limit} are allowed"),
        )
    }

    /// More completion tokens in all (`max_tokens` × choices) than one request may ask for.
    pub fn too_many_tokens(total: u64, limit: u64) -> Self {
        Self::invalid(
            "max_tokens",
            format!("this request asks for up to {total} completion tokens in all (max_tokens × n × prompts); at most {limit} are allowed"),
        )
    }

    /// A token id the model's vocabulary does not have.
    pub fn token_out_of_vocabulary(id: u32, vocab: usize) -> Self {
        Self::invalid(
            "prompt",
            format!("token id {id} is outside the model's vocabulary of {vocab} tokens"),
        )
    }

    /// A field only the router may set (see
    /// [`ParsedRequest::engine_control`](super::request::ParsedRequest::engine_control)).
    pub fn engine_control(field: &'static str) -> Self {
        Self {
            message: format!(
                "'{field}' steers an engine's disaggregated serving and is set by the router alone; remove it"
            ),
            param: Some(field.into()),
            code: "invalid_value",
        }
    }

    /// The model's chat template refused the conversation (`raise_exception`), or it
    /// cannot be rendered: the engine would refuse it too.
    pub fn chat_template(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some("messages".to_owned()),
            code: "chat_template_error",
        }
    }

    pub(crate) fn wrong_type(param: &str, err: &serde_json::Error) -> Self {
        Self {
            message: format!("invalid type for '{param}': {}", serde_message(err)),
            param: Some(param.to_owned()),
            code: "invalid_type",
        }
    }

    pub(crate) fn missing(param: &str) -> Self {
        Self {
            message: format!("missing required parameter: '{param}'"),
            param: Some(param.to_owned()),
            code: "missing_required_parameter",
        }
    }
}

/// serde_json's message without its " at line L column C" suffix, which points into a
/// fragment rather than the client's body.
fn serde_message(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// One chat message, with its text parts borrowed from the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<'a> {
    pub role: Cow<'a, str>,
    pub parts: Vec<Cow<'a, str>>,
}

/// A chat request's raw input to a model's chat template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateInput<'a> {
    pub messages_json: Option<Cow<'a, str>>,
    pub tools_json: Option<Cow<'a, str>>,
    pub add_generation_prompt: bool,
}

/// A string that borrows from the body when it has no escapes (a bare `Cow<str>` would
/// always copy).
#[derive(Deserialize)]
pub(crate) struct Text<'a>(#[serde(borrow)] pub(crate) Cow<'a, str>);

/// A conversation converted for the chat template and the built-in tokenizer.
#[derive(Debug)]
pub(crate) struct Converted<'a> {
    pub(crate) messages: Vec<Message<'a>>,
    pub(crate) template: TemplateInput<'a>,
}

impl<'a> Converted<'a> {
    /// `messages` for routing, with what the model's template renders: `chat` (the same
    /// conversation as chat messages) and `tools_json`.
    pub(crate) fn new(
        messages: Vec<Message<'a>>,
        chat: Vec<serde_json::Value>,
        tools_json: Option<Cow<'a, str>>,
    ) -> Self {
        Self {
            messages,
            template: TemplateInput {
                messages_json: Some(Cow::Owned(serde_json::Value::from(chat).to_string())),
                tools_json,
                add_generation_prompt: true,
            },
        }
    }
}

/// A chat template's `function` tool from a Messages or Responses tool: its name,
/// description and JSON-schema parameters (an open object when absent or unreadable).
pub(crate) fn function_tool(
    name: Cow<'_, str>,
    description: Option<Text<'_>>,
    schema: Option<&serde_json::value::RawValue>,
) -> serde_json::Value {
    let schema = schema
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s.get()).ok())
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    serde_json::json!({"type": "function", "function": {
        "name": name,
        "description": description.map(|d| d.0).unwrap_or_default(),
        "parameters": schema,
    }})
}

pub(crate) fn content_type_error(param: String) -> RequestError {
    RequestError {
        message: format!(
            "invalid type for '{param}': expected a string, an array of content parts or null"
        ),
        param: Some(param),
        code: "invalid_type",
    }
}
