//! A model's chat template (`tokenizer_config.json`'s `chat_template`) rendered as Hugging
//! Face `transformers` renders it: Jinja with `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception`, `tojson`, Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...), and the special tokens as variables.

use std::collections::HashMap;
use std::sync::Mutex;

use minijinja::{Environment, ErrorKind, Value};
use serde::Deserialize;

use super::json_array;
use super::piece_cache::PieceHashes;
use super::HfTokenizerError;

/// The name the template is registered under.
const NAME: &str = "chat";

/// Messages (and tool lists) shorter than this, as JSON, are parsed each time.
const MIN_KEPT_MESSAGE_BYTES: usize = 512;
/// Bytes of messages' JSON kept parsed; beyond, the cache starts over.
const KEPT_MESSAGES_BYTES: usize = 32 << 20;

/// A compiled chat template and the special tokens it may name.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as strings.
    special: Vec<(&'static str, String)>,
    /// Long messages and tool lists already parsed into the template's values, by their
    /// JSON: a session's every step sends its earlier messages and its tools again, and
    /// parsing them (reading every string of an agent-sized prompt into a value of its
    /// own) was about 40% of a step's render.
    parsed: Mutex<KeptMessages>,
}

/// Messages' JSON → their values, within [`KEPT_MESSAGES_BYTES`]. Keyed by the whole
/// JSON (not a hash of it: a client who could make two messages collide would see one
/// rendered as the other), hashed from a per-process seed.
#[derive(Debug, Default)]
struct KeptMessages {
    values: HashMap<Box<str>, Value, PieceHashes>,
    bytes: usize,
}

/// `tokenizer_config.json`'s `chat_template`: one template, or named ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
pub(super) struct NamedTemplate {
    name: String,
    template: String,
}

impl TemplateField {
    /// The default template (`default` among named ones, else the first).
    fn default_source(self) -> Option<String> {
        match self {
            TemplateField::One(t) => Some(t),
            TemplateField::Named(list) => {
                let pick = list.iter().position(|t| t.name == "default").unwrap_or(0);
                list.into_iter().nth(pick).map(|t| t.template)
            }
        }
    }
}

impl ChatTemplate {
    /// Compiles `field`, with `special` tokens as variables.
    pub(super) fn compile(
        field: TemplateField,
        special: Vec<(&'static str, String)>,
    ) -> Result<Self, HfTokenizerError> {
        let source = field
            .default_source()
            .ok_or(HfTokenizerError::NoChatTemplate)?;
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source)
            .map_err(|e| HfTokenizerError::Template(e.to_string()))?;
        Ok(Self {
            env,
            special,
            parsed: Mutex::default(),
        })
    }

    /// Renders `messages` (and `tools`, JSON arrays as the client sent them).
    pub fn render(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, HfTokenizerError> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", self.messages(messages_json)?),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(tools) = tools_json {
            ctx.push(("tools", self.value_of(tools)?));
        }
        for (name, token) in &self.special {
            ctx.push((name, Value::from(token.as_str())));
        }
        let ctx: Value = ctx.into_iter().collect();
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(ctx))
            .map_err(|e| HfTokenizerError::Template(e.to_string()))
    }

    /// The messages (a JSON array) as a template value, long ones taken from those
    /// parsed before.
    fn messages(&self, messages_json: &str) -> Result<Value, HfTokenizerError> {
        // Split by the array's structure; each element is then parsed or found equal to
        // one parsed before, which is what makes the array valid JSON (`json_array`).
        let Some(list) = json_array::elements(messages_json) else {
            // Not an array: the template sees it as it is (and may refuse it).
            return parse(messages_json);
        };
        list.into_iter()
            .map(|m| self.value_of(m))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::from)
            // An element that does not parse makes the whole fail to parse too: the error
            // is serde's on the whole, as the client sent it.
            .or_else(|_| parse(messages_json))
    }

    /// `json` as a template value: a long one taken from those parsed before, or parsed
    /// and kept.
    fn value_of(&self, json: &str) -> Result<Value, HfTokenizerError> {
        if json.len() < MIN_KEPT_MESSAGE_BYTES {
            return parse(json);
        }
        if let Some(v) = self.kept().values.get(json) {
            return Ok(v.clone());
        }
        let v = parse(json)?;
        let mut kept = self.kept();
        if kept.bytes + json.len() > KEPT_MESSAGES_BYTES {
            *kept = KeptMessages::default();
        }
        if !kept.values.contains_key(json) {
            kept.bytes += json.len();
            kept.values.insert(json.into(), v.clone());
        }
        Ok(v)
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, KeptMessages> {
        self.parsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `text` as a template value: straight into the template's values (not through a
/// `serde_json::Value`, which copies every string of an agent-sized prompt once more).
fn parse(text: &str) -> Result<Value, HfTokenizerError> {
    serde_json::from_str::<Value>(text).map_err(|e| HfTokenizerError::Template(e.to_string()))
}

/// `raise_exception(message)`: a template refusing its input.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> ChatTemplate {
        let source =
            "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}{% endfor %}\
                      {% if tools %}[{{ tools | length }} tools]{% endif %}";
        ChatTemplate::compile(TemplateField::One(source.into()), Vec::new()).unwrap()
    }

    /// Long messages are kept parsed and rendered from the kept values as they were
    /// parsed: the same output whether kept or not, an edited message is its own entry,
    /// short ones are not kept, tools are kept too.
    #[test]
    fn kept_messages_render_as_freshly_parsed_ones() {
        let t = template();
        let long = |c: char| c.to_string().repeat(MIN_KEPT_MESSAGE_BYTES);
        let messages = |last: &str| {
            serde_json::json!([
                {"role": "system", "content": long('s')},
                {"role": "user", "content": "hi \"there\"\n"},
                {"role": "user", "content": last},
            ])
            .to_string()
        };
        let tools = serde_json::json!([{"name": long('t')}, {"name": "x"}]).to_string();
        let first = t.render(&messages(&long('a')), Some(&tools), true).unwrap();
        assert_eq!(t.kept().values.len(), 3, "two long messages and the tools");
        let again = t.render(&messages(&long('a')), Some(&tools), true).unwrap();
        assert_eq!(again, first);
        assert_eq!(t.kept().values.len(), 3, "found, not parsed again");
        let edited = t.render(&messages(&long('b')), Some(&tools), true).unwrap();
        assert!(edited.contains(&long('b')) && !edited.contains(&long('a')));
        assert_eq!(t.kept().values.len(), 4);
        let fresh = template()
            .render(&messages(&long('b')), Some(&tools), true)
            .unwrap();
        assert_eq!(edited, fresh);
        assert!(fresh.ends_with("[2 tools]"));
    }

    /// What is not a list of messages is refused as before (parsed as it is).
    #[test]
    fn messages_that_are_not_a_list_are_refused_as_the_template_sees_them() {
        let t = template();
        assert!(t.render("{not json", None, true).is_err());
        let bad = "[{\"role\": \"user\", \"content\": 1}, oops]";
        let err = t.render(bad, None, true).unwrap_err();
        // Split by structure, its element `oops` fails; the error is serde's on the whole.
        assert_eq!(err.to_string(), parse(bad).unwrap_err().to_string());
        assert_eq!(t.render("[]", None, true).unwrap(), "");
    }
}
