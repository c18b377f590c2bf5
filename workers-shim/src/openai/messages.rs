//! Anthropic Messages bodies (`POST /v1/messages`, what Claude Code sends) as the chat
//! conversation an engine renders: `system` (a string or text blocks) first, then each
//! message's blocks — `text` as text, `tool_use` as an assistant tool call, `tool_result`
//! as a `tool` message — and `tools` as chat function tools (`input_schema` → `parameters`).
//! `thinking`, images and documents add no prompt text. vLLM's `/v1/messages` converts the
//! same way before its chat template runs. Every other field passes to the engine untouched.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::conversation::{
    content_type_error, function_tool, Converted, Message, RequestError, Text,
};

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// One content block; only the fields the prompt needs.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawTool<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    description: Option<Text<'a>>,
    #[serde(borrow, default)]
    input_schema: Option<&'a RawValue>,
}

/// Text of a string or a list of text blocks (other blocks add nothing).
fn text_of<'a>(raw: &'a RawValue, param: &str) -> Result<Vec<Cow<'a, str>>, RequestError> {
    match raw.get().as_bytes().first() {
        Some(b'"') => Ok(vec![
            serde_json::from_str::<Text<'_>>(raw.get())
                .map_err(|e| RequestError::wrong_type(param, &e))?
                .0,
        ]),
        Some(b'[') => {
            let blocks: Vec<Block<'_>> =
                serde_json::from_str(raw.get()).map_err(|e| RequestError::wrong_type(param, &e))?;
            Ok(blocks
                .into_iter()
                .filter(|b| b.kind.0 == "text")
                .filter_map(|b| b.text.map(|t| t.0))
                .collect())
        }
        Some(b'n') => Ok(Vec::new()),
        _ => Err(content_type_error(param.to_owned())),
    }
}

/// `system`, `messages` and `tools` of a Messages body as a chat conversation.
pub(crate) fn convert<'a>(
    system: Option<&'a RawValue>,
    messages: &'a RawValue,
    tools: Option<&'a RawValue>,
) -> Result<Converted<'a>, RequestError> {
    let list: Vec<RawMessage<'_>> = serde_json::from_str(messages.get())
        .map_err(|e| RequestError::wrong_type("messages", &e))?;
    if list.is_empty() {
        return Err(RequestError::invalid(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(list.len() + 1);
    let mut chat = Vec::with_capacity(list.len() + 1);
    if let Some(system) = system {
        let parts = text_of(system, "system")?;
        if !parts.is_empty() {
            chat.push(json!({"role": "system", "content": parts.join("\n")}));
            out.push(Message {
                role: Cow::Borrowed("system"),
                parts,
            });
        }
    }
    for (i, m) in list.into_iter().enumerate() {
        let role = m.role.0;
        // Claude Code also sends `system` messages mid-conversation (reminders); vLLM's
        // converter passes them on as chat system messages.
        if !matches!(role.as_ref(), "user" | "assistant" | "system") {
            return Err(RequestError::invalid(
                format!("messages[{i}].role"),
                format!("unknown role '{role}' (expected one of: user, assistant, system)"),
            ));
        }
        let param = format!("messages[{i}].content");
        let content = m.content.ok_or_else(|| RequestError::missing(&param))?;
        convert_message(role, content, &param, &mut out, &mut chat)?;
    }
    let tools_json = match tools.filter(|t| t.get() != "null") {
        Some(raw) => {
            let list: Vec<RawTool<'_>> = serde_json::from_str(raw.get())
                .map_err(|e| RequestError::wrong_type("tools", &e))?;
            let chat_tools: Vec<Value> = list
                .into_iter()
                // Server tools (`web_search_…`) are the provider's, not the model's template's.
                .filter(|t| t.kind.as_ref().is_none_or(|k| k.0 == "custom"))
                .filter_map(|t| Some(function_tool(t.name?.0, t.description, t.input_schema)))
                .collect();
            (!chat_tools.is_empty()).then(|| Cow::Owned(Value::from(chat_tools).to_string()))
        }
        None => None,
    };
    Ok(Converted::new(out, chat, tools_json))
}

/// One Anthropic message as chat messages: its tool results first (each a `tool`
/// message), then its text and tool calls.
fn convert_message<'a>(
    role: Cow<'a, str>,
    content: &'a RawValue,
    param: &str,
    out: &mut Vec<Message<'a>>,
    chat: &mut Vec<Value>,
) -> Result<(), RequestError> {
    let blocks: Vec<Block<'_>> = match content.get().as_bytes().first() {
        Some(b'"') => {
            let text = serde_json::from_str::<Text<'_>>(content.get())
                .map_err(|e| RequestError::wrong_type(param, &e))?
                .0;
            chat.push(json!({"role": role.as_ref(), "content": text.as_ref()}));
            out.push(Message {
                role,
                parts: vec![text],
            });
            return Ok(());
        }
        Some(b'[') => {
            serde_json::from_str(content.get()).map_err(|e| RequestError::wrong_type(param, &e))?
        }
        _ => return Err(content_type_error(param.to_owned())),
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.into_iter().enumerate() {
        match b.kind.0.as_ref() {
            "text" => match b.text {
                Some(t) => parts.push(t.0),
                None => {
                    return Err(RequestError::invalid(
                        format!("{param}[{j}].text"),
                        "a 'text' block needs a 'text' string",
                    ))
                }
            },
            "tool_use" => {
                let name = b
                    .name
                    .map(|n| n.0)
                    .ok_or_else(|| RequestError::missing(&format!("{param}[{j}].name")))?;
                let args = b.input.map_or("{}", RawValue::get);
                parts.push(Cow::Owned(format!("<tool_call>{name}({args})</tool_call>")));
                calls.push(json!({
                    "id": b.id.map(|i| i.0).unwrap_or_default(),
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }));
            }
            "tool_result" => {
                let text = match b.content {
                    Some(c) => text_of(c, &format!("{param}[{j}].content"))?,
                    None => Vec::new(),
                };
                chat.push(json!({
                    "role": "tool",
                    "tool_call_id": b.tool_use_id.map(|i| i.0).unwrap_or_default(),
                    "content": text.join("\n"),
                }));
                out.push(Message {
                    role: Cow::Borrowed("tool"),
                    parts: text,
                });
            }
            // thinking, redacted_thinking, image, document, server tool blocks.
            _ => {}
        }
    }
    if parts.is_empty() && calls.is_empty() {
        return Ok(());
    }
    let text: Vec<&str> = parts
        .iter()
        .map(AsRef::as_ref)
        .filter(|p: &&str| !p.starts_with("<tool_call>"))
        .collect();
    let mut m = json!({"role": role.as_ref(), "content": text.join("\n")});
    if !calls.is_empty() {
        m["tool_calls"] = Value::from(calls);
    }
    chat.push(m);
    out.push(Message { role, parts });
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::openai::{parse, Endpoint, Prompt};

    #[test]
    fn a_messages_body_becomes_a_chat_conversation_with_its_tools() {
        let body = br#"{"model":"m","max_tokens":64,
            "system":[{"type":"text","text":"be brief"},{"type":"text","text":"and kind","cache_control":{"type":"ephemeral"}}],
            "messages":[
              {"role":"user","content":"list files"},
              {"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"ls","input":{"path":"."}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a.rs"}]},{"type":"text","text":"thanks"}]}],
            "tools":[{"name":"ls","description":"list","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],
            "thinking":{"type":"enabled","budget_tokens":1024},"context_management":{"edits":[]}}"#;
        let req = parse(body, Endpoint::Messages).unwrap();
        assert_eq!(req.sampling.max_tokens, Some(64));
        let Prompt::Chat(m) = &req.prompt else {
            panic!()
        };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_ref()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[0].parts, ["be brief", "and kind"]);
        assert_eq!(
            m[2].parts,
            ["ok", r#"<tool_call>ls({"path":"."})</tool_call>"#]
        );
        let chat: serde_json::Value =
            serde_json::from_str(req.template.messages_json.as_deref().unwrap()).unwrap();
        assert_eq!(chat[2]["tool_calls"][0]["function"]["name"], "ls");
        assert_eq!(chat[3]["role"], "tool");
        assert_eq!(chat[3]["content"], "a.rs");
        let tools: serde_json::Value =
            serde_json::from_str(req.template.tools_json.as_deref().unwrap()).unwrap();
        assert_eq!(tools.as_array().unwrap().len(), 1, "server tools left out");
        assert_eq!(tools[0]["function"]["parameters"]["type"], "object");
    }

    #[test]
    fn bad_messages_bodies_name_the_offending_field() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, "max_tokens"),
            (br#"{"model":"m","max_tokens":1}"#, "messages"),
            (br#"{"model":"m","max_tokens":1,"messages":[]}"#, "messages"),
            (
                br#"{"model":"m","max_tokens":1,"messages":[{"role":"wizard","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                br#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":5}]}"#,
                "messages[0].content",
            ),
            (
                br#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
                "messages[0].content[0].text",
            ),
            (
                br#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (
                br#"{"model":"m","max_tokens":1,"system":7,"messages":[{"role":"user","content":"x"}]}"#,
                "system",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body, Endpoint::Messages).expect_err(param);
            assert_eq!(e.param.as_deref(), Some(*param), "{e}");
        }
        // A token count needs no max_tokens.
        let body = br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#;
        assert!(parse(body, Endpoint::MessagesCountTokens).is_ok());
    }
}
