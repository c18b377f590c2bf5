//! The Messages API beyond generation (which is proxied like every other):
//! `POST /v1/messages/count_tokens`, the prompt's tokens counted as the router tokenizes it
//! for routing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use ownerserve_shim::openai::Endpoint;

use crate::error::ApiError;
use crate::prompt::Hashing;
use crate::proxy::front::{front_half, Ask};
use crate::server::state::AppState;

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the prompt as the router
/// tokenizes it for routing (the model's own tokenizer and chat template when it has one).
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, ApiError> {
    let ask = Ask {
        endpoint: Endpoint::MessagesCountTokens,
        hashing: Hashing::Peek,
        admits: false,
    };
    front_half(&st, req, ask, async |f| {
        Ok(Json(serde_json::json!({"input_tokens": f.id.prompt_tokens()})).into_response())
    })
    .await
}
