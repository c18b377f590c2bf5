//! Response bodies and SSE chunks in OpenAI's exact shapes.

use serde::Serialize;

/// Token counts of a request (`usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// Breakdown of prompt tokens; `cached_tokens` came from the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

impl Usage {
    /// Usage with `total_tokens` filled in.
    pub fn new(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// Natural end or a stop string.
    Stop,
    /// Hit `max_tokens` (or the model's length limit).
    Length,
}

/// The assistant's message in a non-streaming chat response.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage<'a> {
    pub role: &'static str,
    pub content: &'a str,
}

/// One choice of a non-streaming chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice<'a> {
    pub index: u32,
    pub message: AssistantMessage<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: FinishReason,
}

/// One choice of a non-streaming text completion.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<()>,
    pub finish_reason: FinishReason,
}

/// A whole non-streaming response (`chat.completion` or `text_completion`).
#[derive(Debug, Clone, Serialize)]
pub struct Completion<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    pub usage: Usage,
}

/// The `delta` of a streamed chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
}

/// One choice inside a streamed chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

/// One choice inside a streamed text-completion chunk.
#[derive(Debug, Clone, Serialize)]
pub struct TextChunkChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<()>,
    pub finish_reason: Option<FinishReason>,
}

/// A streamed chunk. With `stream_options.include_usage`, every chunk carries `usage`
/// (`null` until the final, choice-less usage chunk), as OpenAI documents.
#[derive(Debug, Clone, Serialize)]
pub struct Chunk<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: UsageField,
}

/// The `usage` key of a chunk: absent, `null`, or the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum UsageField {
    #[serde(skip)]
    Absent,
    Null(Option<()>),
    Totals(Usage),
}

impl UsageField {
    fn is_absent(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}
