//! Ingress: the client's body read within its limit, parsed and validated by the shared
//! OpenAI parser, and its model checked against the fleet. Nothing past this stage sees an
//! unvalidated request. (Client keys are checked before, by `ownerserve_edge::api_keys`,
//! and never passed on: the engines get `router.engine_api_key`.)

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use bytes::Bytes;
use http_body_util::BodyExt;

use ownerserve_shim::openai::{self, Endpoint, ParsedRequest, RequestError};

use crate::config::RequestLimits;
use crate::error::ApiError;
use crate::registry::{ModelAvailability, Registry};

/// A client request read within its limit, with its id.
pub struct Admitted {
    pub parts: Parts,
    pub body: Bytes,
    /// The client's `X-Request-Id`, or a fresh one; every leg to the workers carries it.
    pub request_id: HeaderValue,
}

impl Admitted {
    /// Reads `req`'s body up to `limit` bytes, within `within` (a client dripping its body
    /// holds a connection and a buffer no longer than that).
    pub async fn read(req: Request, limit: usize, within: Duration) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let body = tokio::time::timeout(within, read_body(&parts.headers, body, limit))
            .await
            .map_err(|_| ApiError::BodyTimeout { after: within })??;
        let request_id = ownerserve_edge::request_id::of(&parts.headers);
        Ok(Self {
            parts,
            body,
            request_id,
        })
    }

    /// The body parsed and validated for `endpoint`, within `limits`, its model served by
    /// `registry`.
    pub fn parse(
        &self,
        endpoint: Endpoint,
        registry: &Registry,
        limits: RequestLimits,
    ) -> Result<ParsedRequest<'_>, ApiError> {
        let parsed = openai::parse(&self.body, endpoint)?;
        check_limits(limits, &parsed)?;
        // Where an engine pulls KV from, or which bootstrap server it joins, is the
        // router's decision: a client's value would steer the engine to any address.
        if let Some(field) = parsed.engine_control {
            return Err(RequestError::engine_control(field).into());
        }
        check_model(registry, &parsed.model)?;
        Ok(parsed)
    }
}

/// Refuses a request asking for more work than `limits` allow.
fn check_limits(limits: RequestLimits, parsed: &ParsedRequest<'_>) -> Result<(), RequestError> {
    let choices = parsed.choices();
    if choices > limits.max_choices {
        return Err(RequestError::too_many_choices(choices, limits.max_choices));
    }
    let total = choices.saturating_mul(u64::from(parsed.sampling.max_tokens.unwrap_or(0)));
    if total > limits.max_completion_tokens {
        return Err(RequestError::too_many_tokens(
            total,
            limits.max_completion_tokens,
        ));
    }
    Ok(())
}

/// Most bytes of an oversized body read and discarded before answering 413, so the client
/// can finish sending and read the error instead of seeing a reset connection.
const DRAIN_LIMIT_BYTES: u64 = 256 * 1024 * 1024;

/// Reads the body up to `limit` bytes. A bigger body is drained (up to a cap) and refused.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT_BYTES) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let mut body = body;
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BodyRead(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT_BYTES {
            break;
        }
        if seen <= limit as u64 {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit as u64 {
        return Err(ApiError::BodyTooLarge { limit });
    }
    Ok(buf.freeze())
}

/// Fails for a model no worker serves (404) or none serves right now (503).
fn check_model(registry: &Registry, model: &str) -> Result<(), ApiError> {
    match registry.availability(model) {
        ModelAvailability::Available => Ok(()),
        ModelAvailability::Unavailable => Err(ApiError::NoHealthyWorker {
            model: model.to_owned(),
        }),
        ModelAvailability::Unknown => Err(ApiError::ModelNotFound(model.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(
        body: &'static [u8],
        declared: Option<u64>,
        limit: usize,
    ) -> Result<Bytes, ApiError> {
        let mut headers = HeaderMap::new();
        if let Some(n) = declared {
            headers.insert(header::CONTENT_LENGTH, n.into());
        }
        read_body(&headers, Body::from(body), limit).await
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole_and_a_larger_one_refused() {
        assert_eq!(
            read(b"{\"a\":1}", Some(7), 7).await.unwrap(),
            &b"{\"a\":1}"[..]
        );
        assert!(matches!(
            read(b"{\"a\":1}", None, 6).await,
            Err(ApiError::BodyTooLarge { limit: 6 })
        ));
        // A declared length past the drain cap is refused before reading anything.
        assert!(matches!(
            read(b"", Some(DRAIN_LIMIT_BYTES + 1), 1024).await,
            Err(ApiError::BodyTooLarge { limit: 1024 })
        ));
    }
}
