//! Ingress: the client's body read within its limit, parsed and validated by the shared
//! OpenAI parser, and its model checked against the fleet. Nothing past this stage sees an
//! unvalidated request. (Client keys are checked before, by `ownerserve_edge::api_keys`,
//! and never passed on: the engines get `router.engine_api_key`.)

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use ownerserve_shim::openai::{self, Endpoint, ParsedRequest, RequestError};

use crate::config::{BodySettings, RequestLimits};
use crate::error::ApiError;
use crate::fleet::registry::{ModelAvailability, Registry};
use crate::prompt::Prompted;

/// A client request read within its limit, with its id.
pub struct Admitted {
    pub parts: Parts,
    pub body: Bytes,
    /// The client's `X-Request-Id`, or a fresh one; every leg to the workers carries it.
    pub request_id: HeaderValue,
    /// The body's share of the router's body budget, returned when this is dropped.
    _budget: Option<OwnedSemaphorePermit>,
}

/// How a client's body may arrive, and the budget all bodies in flight share.
pub struct BodyLimits {
    pub s: BodySettings,
    /// Bytes of bodies the router may still take, one permit a byte.
    pub budget: Arc<Semaphore>,
}

/// How long a body may take before its rate is checked: a slow start (TLS, a congested
/// link) is not a drip.
pub const RATE_GRACE: Duration = Duration::from_secs(5);

impl BodyLimits {
    pub fn new(s: BodySettings) -> Self {
        Self {
            budget: Arc::new(Semaphore::new(s.budget_bytes.min(Semaphore::MAX_PERMITS))),
            s,
        }
    }
}

impl Admitted {
    /// Reads `req`'s body within `limits` (a client dripping its body holds a connection
    /// and a buffer no longer than they allow; all clients' bodies together hold no more
    /// than the budget).
    pub async fn read(req: Request, limits: &BodyLimits) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let (body, budget) =
            tokio::time::timeout(limits.s.timeout, read_body(&parts.headers, body, limits))
                .await
                .map_err(|_| ApiError::BodyTimeout {
                    after: limits.s.timeout,
                })??;
        let request_id = ownerserve_edge::request_id::of(&parts.headers);
        Ok(Self {
            parts,
            body,
            request_id,
            _budget: budget,
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

/// Refuses a prompt that, with its completion, does not fit the model's context (when
/// its token count is exact: see [`Prompted::context_limit`]), as the engine would after
/// queueing it.
pub fn check_context(parsed: &ParsedRequest<'_>, prompted: &Prompted) -> Result<(), ApiError> {
    let Some(limit) = prompted.context_limit else {
        return Ok(());
    };
    let (tokens, completion) = (
        prompted.hashed.tokenized.tokens.len(),
        parsed.sampling.max_tokens.unwrap_or(1),
    );
    if tokens + completion as usize > limit as usize {
        return Err(RequestError::context_length(limit, tokens, completion).into());
    }
    Ok(())
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

/// Takes `n` bytes more from the body budget into `held`, or fails at once.
fn reserve(
    budget: &Arc<Semaphore>,
    held: &mut Option<OwnedSemaphorePermit>,
    n: usize,
) -> Result<(), ApiError> {
    if n == 0 {
        return Ok(());
    }
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    let more = budget
        .clone()
        .try_acquire_many_owned(n)
        .map_err(|_| ApiError::RouterBusy {
            why: "too many request bodies are in flight",
        })?;
    match held {
        Some(h) => h.merge(more),
        None => *held = Some(more),
    }
    Ok(())
}

/// Reads the body up to `limits.s.max_bytes`, each byte taken from the budget as it comes
/// (a declared length up front). A bigger body is drained (up to a cap) and refused; one
/// falling behind the minimum rate is cut.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limits: &BodyLimits,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
    let limit = limits.s.max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT_BYTES) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let expected = declared.unwrap_or(0).min(limit as u64) as usize;
    let mut held = None;
    reserve(&limits.budget, &mut held, expected)?;
    let started = Instant::now();
    let mut body = body;
    let mut buf = bytes::BytesMut::with_capacity(expected);
    let mut seen: u64 = 0;
    loop {
        // The next frame must come before the body falls behind the minimum rate.
        let frame = match limits.s.min_bytes_per_s {
            0 => body.frame().await,
            rate => {
                let due = Duration::from_secs_f64((seen + 1) as f64 / rate as f64);
                tokio::time::timeout_at(started + due.max(RATE_GRACE), body.frame())
                    .await
                    .map_err(|_| ApiError::BodySlow {
                        min_bytes_per_s: rate,
                    })?
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| ApiError::BodyRead(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT_BYTES {
            break;
        }
        if seen <= limit as u64 {
            let beyond = (buf.len() + data.len()).saturating_sub(expected.max(buf.len()));
            reserve(&limits.budget, &mut held, beyond)?;
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit as u64 {
        return Err(ApiError::BodyTooLarge { limit });
    }
    Ok((buf.freeze(), held))
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

    fn limits(max_bytes: usize, min_bytes_per_s: u64, budget_bytes: usize) -> BodyLimits {
        BodyLimits::new(BodySettings {
            max_bytes,
            timeout: Duration::from_secs(60),
            min_bytes_per_s,
            budget_bytes,
        })
    }

    async fn read(
        body: &'static [u8],
        declared: Option<u64>,
        limit: usize,
    ) -> Result<Bytes, ApiError> {
        let mut headers = HeaderMap::new();
        if let Some(n) = declared {
            headers.insert(header::CONTENT_LENGTH, n.into());
        }
        read_body(&headers, Body::from(body), &limits(limit, 0, 1 << 20))
            .await
            .map(|(b, _)| b)
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

    #[tokio::test]
    async fn bodies_in_flight_share_one_budget_returned_when_they_are_dropped() {
        let l = limits(1000, 0, 1500);
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, 1000.into());
        let first = read_body(&declared, Body::from(vec![b'a'; 1000]), &l)
            .await
            .unwrap();
        assert_eq!(l.budget.available_permits(), 500);
        // A declared body that does not fit is refused before a byte is read; so is an
        // undeclared one, as soon as it goes over.
        assert!(matches!(
            read_body(&declared, Body::from(vec![b'b'; 1000]), &l).await,
            Err(ApiError::RouterBusy { .. })
        ));
        assert!(matches!(
            read_body(&HeaderMap::new(), Body::from(vec![b'c'; 600]), &l).await,
            Err(ApiError::RouterBusy { .. })
        ));
        assert_eq!(
            l.budget.available_permits(),
            500,
            "a refused body keeps nothing"
        );
        drop(first);
        assert_eq!(l.budget.available_permits(), 1500);
        // An undeclared body takes exactly its length.
        let (b, held) = read_body(&HeaderMap::new(), Body::from(vec![b'd'; 600]), &l)
            .await
            .unwrap();
        assert_eq!((b.len(), l.budget.available_permits()), (600, 900));
        drop(held);
        assert_eq!(l.budget.available_permits(), 1500);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dripping_body_is_cut_when_it_falls_behind_the_minimum_rate() {
        let l = limits(1 << 20, 100, 1 << 20);
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes>::new(1);
        let started = Instant::now();
        let drip = tokio_util::task::TaskTracker::new().spawn(async move {
            // 10 bytes a second: fine for the grace period, behind 100 B/s after it.
            for _ in 0..100 {
                if tx
                    .send_data(Bytes::from_static(b"0123456789"))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let r = read_body(&HeaderMap::new(), Body::new(body), &l).await;
        assert!(
            matches!(
                r,
                Err(ApiError::BodySlow {
                    min_bytes_per_s: 100
                })
            ),
            "{:?}",
            r.err()
        );
        // Cut once the 5 s grace is over, not at the 60 s timeout.
        let after = started.elapsed();
        assert!(
            after >= RATE_GRACE && after < Duration::from_secs(6),
            "{after:?}"
        );
        drip.abort();
        // A body that keeps the rate is read whole.
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes>::new(1);
        let steady = tokio_util::task::TaskTracker::new().spawn(async move {
            for _ in 0..20 {
                tx.send_data(Bytes::from(vec![b'x'; 200])).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let (b, _) = read_body(&HeaderMap::new(), Body::new(body), &l)
            .await
            .unwrap();
        assert_eq!(b.len(), 4000);
        steady.await.unwrap();
    }
}
