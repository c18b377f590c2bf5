//! Which worker holds each stored Responses answer (`store: true`): the engine that
//! produced it is the only one that can continue it (`previous_response_id`), return it
//! (`GET /v1/responses/{id}`) or cancel it, so those go to that owner — and when the
//! owner is gone, the client gets an error naming the lost response, never another
//! engine's "not found" or a silent answer without the conversation.
//!
//! The record of truth is the ownership directory (`Command::RecordResponse`: replicated,
//! so every router replica agrees; marked lost when the worker's last lease ends; expired
//! and capped there). In front of it, [`ResponseOwners`] keeps what this router relayed
//! itself: the answer for a router without a directory, and for a record the directory
//! did not take (it was unreachable).
//!
//! An owner is learnt from the answer itself: [`Recording`] reads the response id at the
//! head of the body (the JSON body's `id`, or the stream's `response.created` event) as
//! it is relayed, and holds that frame back until the directory has committed the record
//! (at most the claim timeout), so a client that has seen the id can send a follow-up to
//! any router replica and find its owner.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::WorkerId;

use crate::ownership::ownership_sync::OwnershipSync;

/// Records kept; past this the oldest is forgotten (the directory's cap is the same).
const CAPACITY: usize = ownerserve_ownership::response_map::MAX_RESPONSES;

/// How long a record lives: in the directory from when it is stored; here renewed by
/// every follow-up.
pub const LEASE: Duration = Duration::from_secs(24 * 3600);

/// Bytes at the head of an answer searched for its id.
const HEAD_BYTES: usize = 8 * 1024;

#[derive(Default)]
struct Inner {
    map: HashMap<String, (WorkerId, Instant)>,
    order: VecDeque<String>,
}

/// Response id → owning worker, with leases: this router's own records.
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

/// Where a stored response's owner is recorded: this router's records and, when there is
/// one, the directory.
pub struct Recorder {
    pub owners: Arc<ResponseOwners>,
    pub directory: Option<OwnershipSync>,
    /// The longest a relayed answer waits for the directory to commit its record.
    pub patience: Duration,
}

impl Recorder {
    /// Records in the directory of `sync` (when there is one), each waited for up to the
    /// configured ownership claim timeout.
    pub fn new(sync: &Option<OwnershipSync>, cfg: &crate::config::RouterConfig) -> Arc<Self> {
        Arc::new(Self {
            owners: Arc::default(),
            directory: sync.clone(),
            patience: cfg.ownership_claim_timeout,
        })
    }

    /// Records `worker` as the owner of response `id`, here and in the directory.
    async fn record(self: Arc<Self>, id: String, worker: WorkerId) {
        self.owners.record(&id, worker, Instant::now());
        let Some(sync) = &self.directory else {
            return;
        };
        let Some(lease) = sync.lease_of(worker) else {
            tracing::warn!(response = %id, %worker, "stored response not in the directory: its worker has no lease yet");
            return;
        };
        let command = Command::RecordResponse {
            id: id.clone(),
            lease,
            ttl_ms: LEASE.as_millis() as u64,
        };
        match tokio::time::timeout(self.patience, sync.client().write(command)).await {
            Ok(Ok(Outcome::ResponseRecorded { .. })) => {}
            Ok(Ok(other)) => {
                tracing::warn!(response = %id, outcome = ?other, "the directory refused a stored response");
            }
            Ok(Err(e)) => {
                tracing::warn!(response = %id, error = %e, "stored response not in the directory")
            }
            Err(_) => {
                tracing::warn!(response = %id, "stored response not in the directory in time")
            }
        }
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

type Pending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An answer's body that records the owner of the response it carries as it passes: the
/// frame naming the response is held until the record is committed.
pub struct Recording {
    inner: Body,
    head: Vec<u8>,
    done: bool,
    worker: WorkerId,
    recorder: Arc<Recorder>,
    held: Option<(Pending, Frame<Bytes>)>,
}

impl Recording {
    pub fn new(inner: Body, worker: WorkerId, recorder: Arc<Recorder>) -> Self {
        Self {
            inner,
            head: Vec::new(),
            done: false,
            worker,
            recorder,
            held: None,
        }
    }

    /// Looks for the response id in `frame`; once found, the record to wait for.
    fn scan(&mut self, frame: &Frame<Bytes>) -> Option<Pending> {
        let data = frame.data_ref()?;
        let take = data.len().min(HEAD_BYTES.saturating_sub(self.head.len()));
        self.head.extend_from_slice(&data[..take]);
        match id_in(&self.head) {
            Some(id) => {
                self.done = true;
                let record = self.recorder.clone().record(id.to_owned(), self.worker);
                Some(Box::pin(record))
            }
            None => {
                self.done = self.head.len() >= HEAD_BYTES;
                None
            }
        }
    }
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some((pending, _)) = this.held.as_mut() {
            ready!(pending.as_mut().poll(cx));
            return Poll::Ready(this.held.take().map(|(_, frame)| Ok(frame)));
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let Some(Ok(frame)) = frame else {
            return Poll::Ready(frame);
        };
        if this.done {
            return Poll::Ready(Some(Ok(frame)));
        }
        match this.scan(&frame) {
            None => Poll::Ready(Some(Ok(frame))),
            Some(mut pending) => match pending.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Ok(frame))),
                Poll::Pending => {
                    this.held = Some((pending, frame));
                    Poll::Pending
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.held {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
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

    #[tokio::test]
    async fn a_relayed_body_is_unchanged_and_records_its_owner() {
        let owners = Arc::new(ResponseOwners::default());
        let recorder = Arc::new(Recorder {
            owners: owners.clone(),
            directory: None,
            patience: Duration::from_secs(1),
        });
        let text = "event: response.created\ndata: {\"response\":{\"id\":\"resp_9\"}}\n\n";
        let body = Body::new(Recording::new(Body::from(text), WorkerId(4), recorder));
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        assert_eq!(bytes, text.as_bytes());
        assert_eq!(owners.owner("resp_9", Instant::now()), Some(WorkerId(4)));
    }
}
