//! OpenAI Responses bodies (`POST /v1/responses`, what Codex sends) as the chat
//! conversation an engine renders: `instructions` as a system message, then each `input`
//! item — a `message` (`input_text`/`output_text` parts), a `function_call` or
//! `custom_tool_call` as an assistant tool call, a `function_call_output` or
//! `custom_tool_call_output` as a `tool` message — and `function` tools as chat tools.
//! `reasoning` items and other kinds add no prompt text; every field passes to the engine
//! untouched. (A `previous_response_id` chain is prepended by the engine that stored it.)

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::conversation::{
    content_type_error, function_tool, Converted, Message, RequestError, Text,
};

/// One input item; only the fields the prompt needs.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Text<'a>>,
    #[serde(borrow, default)]
    role: Option<Text<'a>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    arguments: Option<Text<'a>>,
    #[serde(borrow, default)]
    input: Option<Text<'a>>,
    #[serde(borrow, default)]
    call_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawTool<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    description: Option<Text<'a>>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

const ROLES: &[&str] = &["user", "assistant", "system", "developer"];

/// Text of a string or a list of text parts (`input_text`, `output_text`, `text`).
fn text_of<'a>(raw: &'a RawValue, param: &str) -> Result<Vec<Cow<'a, str>>, RequestError> {
    match raw.get().as_bytes().first() {
        Some(b'"') => Ok(vec![
            serde_json::from_str::<Text<'_>>(raw.get())
                .map_err(|e| RequestError::wrong_type(param, &e))?
                .0,
        ]),
        Some(b'[') => {
            let parts: Vec<Part<'_>> =
                serde_json::from_str(raw.get()).map_err(|e| RequestError::wrong_type(param, &e))?;
            Ok(parts
                .into_iter()
                .filter(|p| matches!(p.kind.0.as_ref(), "input_text" | "output_text" | "text"))
                .filter_map(|p| p.text.map(|t| t.0))
                .collect())
        }
        Some(b'n') => Ok(Vec::new()),
        _ => Err(content_type_error(param.to_owned())),
    }
}

/// `instructions`, `input` and `tools` of a Responses body as a chat conversation.
pub(crate) fn convert<'a>(
    instructions: Option<&'a RawValue>,
    input: &'a RawValue,
    tools: Option<&'a RawValue>,
) -> Result<Converted<'a>, RequestError> {
    let mut out = Vec::new();
    let mut chat = Vec::new();
    if let Some(i) = instructions.filter(|i| i.get() != "null") {
        let text = serde_json::from_str::<Text<'_>>(i.get())
            .map_err(|e| RequestError::wrong_type("instructions", &e))?
            .0;
        chat.push(json!({"role": "system", "content": text.as_ref()}));
        out.push(Message {
            role: Cow::Borrowed("system"),
            parts: vec![text],
        });
    }
    match input.get().as_bytes().first() {
        Some(b'"') => {
            let text = serde_json::from_str::<Text<'_>>(input.get())
                .map_err(|e| RequestError::wrong_type("input", &e))?
                .0;
            chat.push(json!({"role": "user", "content": text.as_ref()}));
            out.push(Message {
                role: Cow::Borrowed("user"),
                parts: vec![text],
            });
        }
        Some(b'[') => {
            let items: Vec<Item<'_>> = serde_json::from_str(input.get())
                .map_err(|e| RequestError::wrong_type("input", &e))?;
            if items.is_empty() {
                return Err(RequestError::invalid(
                    "input",
                    "'input' must contain at least one item",
                ));
            }
            for (i, item) in items.into_iter().enumerate() {
                convert_item(i, item, &mut out, &mut chat)?;
            }
        }
        _ => {
            return Err(RequestError {
                message: "invalid type for 'input': expected a string or an array of items"
                    .to_owned(),
                param: Some("input".to_owned()),
                code: "invalid_type",
            })
        }
    }
    let tools_json = match tools.filter(|t| t.get() != "null") {
        Some(raw) => {
            let list: Vec<RawTool<'_>> = serde_json::from_str(raw.get())
                .map_err(|e| RequestError::wrong_type("tools", &e))?;
            let chat_tools: Vec<Value> = list
                .into_iter()
                .filter(|t| t.kind.0 == "function")
                .filter_map(|t| Some(function_tool(t.name?.0, t.description, t.parameters)))
                .collect();
            (!chat_tools.is_empty()).then(|| Cow::Owned(Value::from(chat_tools).to_string()))
        }
        None => None,
    };
    Ok(Converted::new(out, chat, tools_json))
}

fn convert_item<'a>(
    i: usize,
    item: Item<'a>,
    out: &mut Vec<Message<'a>>,
    chat: &mut Vec<Value>,
) -> Result<(), RequestError> {
    let kind = item.kind.as_ref().map_or("message", |k| k.0.as_ref());
    match kind {
        "message" => {
            let role = item
                .role
                .map(|r| r.0)
                .ok_or_else(|| RequestError::missing(&format!("input[{i}].role")))?;
            if !ROLES.contains(&role.as_ref()) {
                return Err(RequestError::invalid(
                    format!("input[{i}].role"),
                    format!(
                        "unknown role '{role}' (expected one of: {})",
                        ROLES.join(", ")
                    ),
                ));
            }
            let param = format!("input[{i}].content");
            let content = item.content.ok_or_else(|| RequestError::missing(&param))?;
            let parts = text_of(content, &param)?;
            chat.push(json!({"role": role.as_ref(), "content": parts.join("\n")}));
            out.push(Message { role, parts });
        }
        "function_call" | "custom_tool_call" => {
            let name = item
                .name
                .map(|n| n.0)
                .ok_or_else(|| RequestError::missing(&format!("input[{i}].name")))?;
            let args = item
                .arguments
                .or(item.input)
                .map(|a| a.0)
                .unwrap_or_default();
            chat.push(json!({"role": "assistant", "content": "", "tool_calls": [{
                "id": item.call_id.map(|c| c.0).unwrap_or_default(),
                "type": "function",
                "function": {"name": name.as_ref(), "arguments": args.as_ref()},
            }]}));
            out.push(Message {
                role: Cow::Borrowed("assistant"),
                parts: vec![Cow::Owned(format!("<tool_call>{name}({args})</tool_call>"))],
            });
        }
        "function_call_output" | "custom_tool_call_output" => {
            let parts = match item.output {
                Some(o) => text_of(o, &format!("input[{i}].output"))?,
                None => Vec::new(),
            };
            chat.push(json!({
                "role": "tool",
                "tool_call_id": item.call_id.map(|c| c.0).unwrap_or_default(),
                "content": parts.join("\n"),
            }));
            out.push(Message {
                role: Cow::Borrowed("tool"),
                parts,
            });
        }
        // reasoning, web_search_call, local_shell_call, ...: no prompt text here.
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::openai::{parse, Endpoint, Prompt};

    #[test]
    fn a_responses_body_becomes_a_chat_conversation() {
        let body = br#"{"model":"m","instructions":"be brief","max_output_tokens":9,
            "input":[
              {"type":"message","role":"developer","content":[{"type":"input_text","text":"rules"}]},
              {"role":"user","content":"list files"},
              {"type":"reasoning","summary":[],"encrypted_content":"xx"},
              {"type":"function_call","call_id":"c1","name":"exec","arguments":"{\"cmd\":\"ls\"}"},
              {"type":"function_call_output","call_id":"c1","output":"a.rs"},
              {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}],
            "tools":[{"type":"function","name":"exec","parameters":{"type":"object"}},{"type":"web_search"}],
            "store":false,"previous_response_id":"resp_1","prompt_cache_key":"k","include":["x"]}"#;
        let req = parse(body, Endpoint::Responses).unwrap();
        assert_eq!(req.sampling.max_tokens, Some(9));
        assert!(!req.store);
        assert_eq!(req.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(req.prompt_cache_key.as_deref(), Some("k"));
        let Prompt::Chat(m) = &req.prompt else {
            panic!()
        };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_ref()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
                "assistant"
            ]
        );
        assert_eq!(m[3].parts, [r#"<tool_call>exec({"cmd":"ls"})</tool_call>"#]);
        let tools: serde_json::Value =
            serde_json::from_str(req.template.tools_json.as_deref().unwrap()).unwrap();
        assert_eq!(tools.as_array().unwrap().len(), 1);
        // A plain string input; store defaults to true.
        let req = parse(br#"{"model":"m","input":"hi"}"#, Endpoint::Responses).unwrap();
        assert!(req.store);
        assert_eq!(
            req.prompt_tokens(),
            parse(
                br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                Endpoint::ChatCompletions
            )
            .unwrap()
            .prompt_tokens()
        );
    }

    #[test]
    fn bad_responses_bodies_name_the_offending_field() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"model":"m"}"#, "input"),
            (br#"{"model":"m","input":5}"#, "input"),
            (br#"{"model":"m","input":[]}"#, "input"),
            (
                br#"{"model":"m","input":[{"type":"message","content":"x"}]}"#,
                "input[0].role",
            ),
            (
                br#"{"model":"m","input":[{"role":"wizard","content":"x"}]}"#,
                "input[0].role",
            ),
            (
                br#"{"model":"m","input":"x","max_output_tokens":0}"#,
                "max_output_tokens",
            ),
            (br#"{"model":"m","input":"x","store":"yes"}"#, "store"),
            (
                br#"{"model":"m","input":"x","background":true,"store":false}"#,
                "background",
            ),
            (
                br#"{"model":"m","input":"x","previous_response_id":""}"#,
                "previous_response_id",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body, Endpoint::Responses).expect_err(param);
            assert_eq!(e.param.as_deref(), Some(*param), "{e}");
        }
    }
}
