//! OpenAI-compatible wire types.
//!
//! [`request`] parses and validates `/v1/chat/completions` and `/v1/completions` bodies
//! into a [`conversation`] without copying message text (strings borrow from the body when
//! they have no escapes); the router uses it to reject bad input before dispatch, and the
//! simulated engine to run the request. [`messages`] (Anthropic Messages) and [`responses`] (OpenAI Responses)
//! convert the coding agents' bodies into the same chat conversation. [`response`] holds
//! the response and SSE chunk shapes.

pub mod conversation;
pub mod messages;
pub mod request;
pub mod response;
pub mod responses;

pub use request::{
    parse, Endpoint, Message, ParsedRequest, Prompt, PromptInput, RenderedPrompt, RequestError,
    Sampling, SessionAction, SessionControl, SESSION_TIMEOUT_S,
};
