//! The one table of the client API's endpoints. A new API surface is a row here (and its
//! handler in [`Serves`]); the routes (`api::routes`), the hot front
//! (`server/front.rs`), the endpoint picker (`epp`) and the error mapping (`error.rs`)
//! read the row instead of matching on [`Endpoint`].

use axum::http::Method;
use ownerserve_shim::openai::Endpoint;

/// What answers an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serves {
    /// The request path (`proxy::handle`), the body parsed as this endpoint's.
    Proxy(Endpoint),
    /// Anthropic's token count of a Messages body, as the router tokenizes it.
    CountTokens,
    /// `GET /v1/responses/{id}`: from the worker that stored it.
    StoredGet,
    /// `POST /v1/responses/{id}/cancel`: at the worker that runs it.
    StoredCancel,
    /// `GET /v1/models`: the models the healthy workers serve.
    Models,
}

/// The shape of an endpoint's error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic's `{"type": "error", "error": {"type", "message"}}` (what Claude Code and
    /// the anthropic SDKs read): the routes get `ownerserve_edge::anthropic_errors::rewrite`.
    Anthropic,
}

/// The last event of a stream that fails after it has started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    /// The OpenAI error body as a `data:` event, then `data: [DONE]`.
    OpenAiDone,
    /// Anthropic's `event: error` (no `[DONE]` in that API).
    Anthropic,
    /// The Responses `error` event (no `[DONE]` in that API).
    Responses,
}

/// One endpoint of the client API.
#[derive(Debug)]
pub struct ApiEndpoint {
    /// Its path, as axum routes it (`{id}` a parameter).
    pub path: &'static str,
    pub method: Method,
    /// What answers it.
    pub serves: Serves,
    /// Served by `server/front.rs` straight to the proxy, without axum's router, while no
    /// client keys or rates are set.
    pub hot: bool,
    /// Whether an engine's disaggregated legs (`kv_transfer_params` prefill/decode bodies)
    /// are defined for it: vLLM's NIXL two-step and SGLang's bootstrap pair are chat and
    /// completions protocols; the agents' APIs run whole on one worker.
    pub disaggregable: bool,
    pub errors: ErrorShape,
    /// Its stream's error event (`None`: it never streams).
    pub sse_error: Option<SseError>,
    /// Whether its answers are stored on the worker that served them and addressed later
    /// by id (OpenAI Responses: `store`, `previous_response_id`, reads and cancels).
    pub stored: bool,
}

/// Every endpoint of the client API (`/v1/...`), the proxied ones in the order the
/// fuzzer and the endpoint picker try them.
pub static ENDPOINTS: [ApiEndpoint; 8] = [
    ApiEndpoint {
        path: "/v1/chat/completions",
        method: Method::POST,
        serves: Serves::Proxy(Endpoint::ChatCompletions),
        hot: true,
        disaggregable: true,
        errors: ErrorShape::OpenAi,
        sse_error: Some(SseError::OpenAiDone),
        stored: false,
    },
    ApiEndpoint {
        path: "/v1/completions",
        method: Method::POST,
        serves: Serves::Proxy(Endpoint::Completions),
        hot: true,
        disaggregable: true,
        errors: ErrorShape::OpenAi,
        sse_error: Some(SseError::OpenAiDone),
        stored: false,
    },
    ApiEndpoint {
        path: "/v1/messages",
        method: Method::POST,
        serves: Serves::Proxy(Endpoint::Messages),
        hot: false,
        disaggregable: false,
        errors: ErrorShape::Anthropic,
        sse_error: Some(SseError::Anthropic),
        stored: false,
    },
    ApiEndpoint {
        path: "/v1/messages/count_tokens",
        method: Method::POST,
        serves: Serves::CountTokens,
        hot: false,
        disaggregable: false,
        errors: ErrorShape::Anthropic,
        sse_error: Some(SseError::Anthropic),
        stored: false,
    },
    ApiEndpoint {
        path: "/v1/responses",
        method: Method::POST,
        serves: Serves::Proxy(Endpoint::Responses),
        hot: false,
        disaggregable: false,
        errors: ErrorShape::OpenAi,
        sse_error: Some(SseError::Responses),
        stored: true,
    },
    ApiEndpoint {
        path: "/v1/responses/{id}",
        method: Method::GET,
        serves: Serves::StoredGet,
        hot: false,
        disaggregable: false,
        errors: ErrorShape::OpenAi,
        sse_error: None,
        stored: true,
    },
    ApiEndpoint {
        path: "/v1/responses/{id}/cancel",
        method: Method::POST,
        serves: Serves::StoredCancel,
        hot: false,
        disaggregable: false,
        errors: ErrorShape::OpenAi,
        sse_error: None,
        stored: true,
    },
    ApiEndpoint {
        path: "/v1/models",
        method: Method::GET,
        serves: Serves::Models,
        hot: false,
        disaggregable: false,
        errors: ErrorShape::OpenAi,
        sse_error: None,
        stored: false,
    },
];

impl ApiEndpoint {
    /// The body API it parses, if the request path serves it.
    pub fn proxied(&self) -> Option<Endpoint> {
        match self.serves {
            Serves::Proxy(endpoint) => Some(endpoint),
            _ => None,
        }
    }

    /// The body API it parses: the proxied endpoint's, or Messages' token count.
    fn parses(&self) -> Option<Endpoint> {
        match self.serves {
            Serves::Proxy(endpoint) => Some(endpoint),
            Serves::CountTokens => Some(Endpoint::MessagesCountTokens),
            _ => None,
        }
    }
}

/// The row of the endpoint whose body `endpoint` parses.
#[expect(
    clippy::expect_used,
    reason = "cannot fail: every Endpoint has a row (tests::every_body_api_has_one_row_that_agrees_with_the_parser)"
)]
pub fn of(endpoint: Endpoint) -> &'static ApiEndpoint {
    ENDPOINTS
        .iter()
        .find(|e| e.parses() == Some(endpoint))
        .expect("every Endpoint has a row in ENDPOINTS (tested)")
}

/// The proxied endpoint a request path (with or without its query) names.
pub fn proxied_at(path: &str) -> Option<Endpoint> {
    let path = path.split('?').next().unwrap_or(path);
    ENDPOINTS
        .iter()
        .filter(|e| e.path == path)
        .find_map(ApiEndpoint::proxied)
}

/// The proxied endpoints, in the table's order.
pub fn proxied() -> impl Iterator<Item = Endpoint> {
    ENDPOINTS.iter().filter_map(ApiEndpoint::proxied)
}

/// The hot endpoint a `method` request to `path` is for, if any.
pub fn hot(method: &Method, path: &str) -> Option<&'static ApiEndpoint> {
    ENDPOINTS
        .iter()
        .find(|e| e.hot && e.path == path && e.method == *method)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Messages,
        Endpoint::MessagesCountTokens,
        Endpoint::Responses,
    ];

    #[test]
    fn every_body_api_has_one_row_that_agrees_with_the_parser() {
        for endpoint in ALL {
            let rows: Vec<_> = ENDPOINTS
                .iter()
                .filter(|e| e.parses() == Some(endpoint))
                .collect();
            assert_eq!(rows.len(), 1, "{endpoint:?}");
            let row = of(endpoint);
            assert_eq!(row.path, endpoint.path(), "{endpoint:?}");
            assert_eq!(row.disaggregable, endpoint.disaggregable(), "{endpoint:?}");
            assert_eq!(
                row.errors == ErrorShape::Anthropic,
                endpoint.is_anthropic(),
                "{endpoint:?}"
            );
            assert!(row.sse_error.is_some(), "{endpoint:?}");
        }
    }

    #[test]
    fn only_the_stored_rows_keep_a_stored_answer() {
        let bodies: [(Endpoint, &[u8]); 4] = [
            (
                Endpoint::ChatCompletions,
                br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"store":true}"#,
            ),
            (
                Endpoint::Completions,
                br#"{"model":"m","prompt":"hi","store":true}"#,
            ),
            (
                Endpoint::Messages,
                br#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"store":true}"#,
            ),
            (
                Endpoint::Responses,
                br#"{"model":"m","input":"hi","store":true}"#,
            ),
        ];
        for (endpoint, body) in bodies {
            let parsed = ownerserve_shim::openai::parse(body, endpoint)
                .unwrap_or_else(|e| panic!("{endpoint:?}: {e}"));
            assert_eq!(parsed.store, of(endpoint).stored, "{endpoint:?}");
        }
    }

    #[test]
    fn paths_and_methods_are_unique_and_only_proxied_posts_are_hot() {
        for (i, a) in ENDPOINTS.iter().enumerate() {
            for b in &ENDPOINTS[i + 1..] {
                assert!(a.path != b.path || a.method != b.method, "{}", a.path);
            }
            if a.hot {
                assert!(
                    a.proxied().is_some() && a.method == Method::POST,
                    "{}",
                    a.path
                );
            }
            if a.disaggregable {
                assert!(a.hot, "{}", a.path);
            }
        }
    }

    #[test]
    fn the_hot_routes_are_chat_and_completions_posts() {
        let hot = |m: &Method, p| hot(m, p).and_then(ApiEndpoint::proxied);
        assert_eq!(
            hot(&Method::POST, "/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            hot(&Method::POST, "/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(hot(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(hot(&Method::POST, "/v1/messages"), None);
        assert_eq!(hot(&Method::POST, "/v1/models"), None);
    }

    #[test]
    fn a_path_names_its_proxied_endpoint_with_or_without_a_query() {
        assert_eq!(
            proxied_at("/v1/messages?beta=true"),
            Some(Endpoint::Messages)
        );
        assert_eq!(proxied_at("/v1/responses"), Some(Endpoint::Responses));
        assert_eq!(proxied_at("/v1/messages/count_tokens"), None);
        assert_eq!(proxied_at("/v1/models"), None);
        assert_eq!(
            proxied().collect::<Vec<_>>(),
            [
                Endpoint::ChatCompletions,
                Endpoint::Completions,
                Endpoint::Messages,
                Endpoint::Responses
            ]
        );
    }
}
