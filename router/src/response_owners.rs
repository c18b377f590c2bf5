//! Which worker holds each stored Responses answer (`store: true`): the engine that
//! produced it is the only one that can continue it (`previous_response_id`), return it
//! (`GET /v1/responses/{id}`) or cancel it, so those go to that owner — and when the
//! owner is gone, the client gets an error naming the lost response, never another
//! engine's "not found" or a silent answer without the conversation.
//!
//! An owner is learnt from the answer itself: [`tap`] reads the response id at the
//! head of the body (the JSON body's `id`, or the stream's `response.created` event)
//! as it is relayed. Each record holds a lease, renewed by every follow-up; bounded, the
//! oldest record goes first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;

use ownerserve_planner::ids::WorkerId;

/// Records kept; past this the oldest is forgotten.
const CAPACITY: usize = 200_000;

/// How long a record lives without a follow-up.
pub const LEASE: Duration = Duration::from_secs(24 * 3600);

/// Bytes at the head of an answer searched for its id.
const HEAD_BYTES: usize = 8 * 1024;

#[derive(Default)]
struct Inner {
    map: HashMap<String, (WorkerId, Instant)>,
    order: VecDeque<String>,
}

/// Response id → owning worker, with leases.
#[derive(Default)]
pub struct ResponseOwners {
    inner: Mutex<Inner>,
}

impl ResponseOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `worker` produced response `id` at `now`.
    pub fn record(&self, id: &str, worker: WorkerId, now: Instant) {
        let mut inner = self.lock();
        if inner
            .map
            .insert(id.to_owned(), (worker, now + LEASE))
            .is_none()
        {
            inner.order.push_back(id.to_owned());
        }
        while inner.order.len() > CAPACITY {
            if let Some(old) = inner.order.pop_front() {
                inner.map.remove(&old);
            }
        }
    }

    /// The owner of response `id` at `now` (its lease renewed), if its lease holds.
    pub fn owner(&self, id: &str, now: Instant) -> Option<WorkerId> {
        let mut inner = self.lock();
        let (worker, until) = inner.map.get_mut(id)?;
        if *until < now {
            return None;
        }
        *until = now + LEASE;
        Some(*worker)
    }
}

/// The response id an answer starts with: the first `"id"` key's string value within the
/// head (a Responses body and its `response.created` event both name the response first).
fn id_in(head: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(head)
        .ok()
        .or_else(|| std::str::from_utf8(&head[..head.len().saturating_sub(3)]).ok())?;
    let at = text.find("\"id\"")?;
    let rest = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(&rest[..end]).filter(|id| !id.is_empty())
}

/// Wraps an answer's body so the owner of the response it carries is recorded as it passes.
pub fn tap(body: Body, owners: Arc<ResponseOwners>, worker: WorkerId) -> Body {
    let mut head: Vec<u8> = Vec::new();
    let mut done = false;
    Body::new(http_body_util::BodyExt::map_frame(
        body,
        move |frame: http_body::Frame<Bytes>| {
            if !done {
                if let Some(data) = frame.data_ref() {
                    let take = data.len().min(HEAD_BYTES.saturating_sub(head.len()));
                    head.extend_from_slice(&data[..take]);
                    if let Some(id) = id_in(&head) {
                        owners.record(id, worker, Instant::now());
                        done = true;
                    } else if head.len() >= HEAD_BYTES {
                        done = true;
                    }
                }
            }
            frame
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_read_from_a_body_or_a_streams_first_event() {
        assert_eq!(
            id_in(br#"{"id": "resp_1","object":"response"}"#),
            Some("resp_1")
        );
        assert_eq!(
            id_in(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\""),
            Some("resp_2")
        );
        assert_eq!(id_in(br#"{"id":"resp_3"#), None, "not whole yet");
    }

    #[test]
    fn owners_hold_a_lease_renewed_by_each_follow_up() {
        let owners = ResponseOwners::default();
        let t0 = Instant::now();
        owners.record("r", WorkerId(2), t0);
        assert_eq!(owners.owner("r", t0 + LEASE / 2), Some(WorkerId(2)));
        assert_eq!(owners.owner("r", t0 + LEASE), Some(WorkerId(2)), "renewed");
        assert_eq!(owners.owner("r", t0 + LEASE * 3), None, "lapsed");
        assert_eq!(owners.owner("x", t0), None);
    }
}
