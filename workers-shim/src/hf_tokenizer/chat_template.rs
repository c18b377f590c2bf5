//! A model's chat template (`tokenizer_config.json`'s `chat_template`) rendered as Hugging
//! Face `transformers` renders it: Jinja with `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception`, `tojson`, Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...), and the special tokens as variables.

use minijinja::{Environment, ErrorKind, Value};
use serde::Deserialize;

use super::HfTokenizerError;

/// The name the template is registered under.
const NAME: &str = "chat";

/// A compiled chat template and the special tokens it may name.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as strings.
    special: Vec<(&'static str, String)>,
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
        Ok(Self { env, special })
    }

    /// Renders `messages` (and `tools`, JSON arrays as the client sent them).
    pub fn render(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, HfTokenizerError> {
        // Straight into the template's values (not through a `serde_json::Value`, which
        // copies every string of an agent-sized prompt once more).
        let parse = |text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| HfTokenizerError::Template(e.to_string()))
        };
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", parse(messages_json)?),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(tools) = tools_json {
            ctx.push(("tools", parse(tools)?));
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
}

/// `raise_exception(message)`: a template refusing its input.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}
