//! Why a prompt's computation failed, as the client's error.

use ownerserve_shim::hf_tokenizer::HfTokenizerError;
use ownerserve_shim::openai::RequestError;

use super::flights::FlightError;
use crate::error::ApiError;

/// Why a prompt's computation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PromptError {
    /// The chat template refused the request (the client's error, as the engine's would be).
    #[error("{0}")]
    Template(String),
    #[error("{0}")]
    Encode(String),
}

impl PromptError {
    pub(super) fn encode(e: HfTokenizerError) -> Self {
        PromptError::Encode(e.to_string())
    }

    pub(super) fn into_api(self) -> ApiError {
        match self {
            PromptError::Template(e) => ApiError::BadRequest(RequestError::chat_template(e)),
            PromptError::Encode(e) => ApiError::Internal(e),
        }
    }
}

/// A computation in flight that gave no prompt, as the client's error.
pub(super) fn flight_error(e: FlightError<PromptError>) -> ApiError {
    match e {
        FlightError::Full { .. } => ApiError::RouterBusy {
            why: "too many long prompts are being tokenized or waiting to be",
        },
        FlightError::TimedOut { after } => ApiError::TokenizeTimeout { after },
        FlightError::Lost(e) => ApiError::Internal(format!("tokenizing failed: {e}")),
        FlightError::Work(e) => e.into_api(),
    }
}
