//! The simulated engine's store of Responses answers (`store: true`, vLLM's
//! `VLLM_ENABLE_RESPONSES_API_STORE`): each response's body for `GET /v1/responses/{id}`,
//! its conversation (input and output as chat messages) for a follow-up's
//! `previous_response_id`, and a background response's task for
//! `POST /v1/responses/{id}/cancel`. Bounded: the oldest response goes first.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use tokio::task::AbortHandle;

use crate::openai::Message;

/// Responses kept; past this the oldest is forgotten.
pub(super) const CAPACITY: usize = 10_000;

/// One stored response.
struct Stored {
    body: Value,
    conversation: Vec<Message<'static>>,
    /// A background response still running.
    task: Option<AbortHandle>,
}

/// Why a cancel was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CancelRefused {
    NotFound,
    /// Only a background response that is queued or running can be cancelled.
    NotRunning,
}

#[derive(Default)]
pub(super) struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Stored>,
    order: VecDeque<String>,
}

/// A message whose text no longer borrows from a request body.
pub(super) fn owned(m: &Message<'_>) -> Message<'static> {
    Message {
        role: Cow::Owned(m.role.to_string()),
        parts: m.parts.iter().map(|p| Cow::Owned(p.to_string())).collect(),
    }
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps (or replaces) response `id`. A cancelled response stays cancelled.
    pub(super) fn put(&self, id: &str, body: Value, conversation: Vec<Message<'static>>) {
        let mut inner = self.lock();
        if let Some(s) = inner.map.get_mut(id) {
            if s.body["status"] != "cancelled" {
                s.body = body;
                s.conversation = conversation;
                s.task = None;
            }
            return;
        }
        inner.order.push_back(id.to_owned());
        inner.map.insert(
            id.to_owned(),
            Stored {
                body,
                conversation,
                task: None,
            },
        );
        while inner.order.len() > CAPACITY {
            if let Some(old) = inner.order.pop_front() {
                inner.map.remove(&old);
            }
        }
    }

    /// Records the task of background response `id` (kept by [`Self::put`] before).
    pub(super) fn set_task(&self, id: &str, task: AbortHandle) {
        if let Some(s) = self.lock().map.get_mut(id) {
            if s.body["status"] == "cancelled" {
                task.abort();
            } else {
                s.task = Some(task);
            }
        }
    }

    pub(super) fn body(&self, id: &str) -> Option<Value> {
        self.lock().map.get(id).map(|s| s.body.clone())
    }

    /// The conversation a follow-up of `id` continues; `None` for an unknown id.
    pub(super) fn conversation(&self, id: &str) -> Option<Vec<Message<'static>>> {
        self.lock().map.get(id).map(|s| s.conversation.clone())
    }

    /// Cancels background response `id`: its task stops (the engine aborts its sequence)
    /// and its status becomes `cancelled`.
    pub(super) fn cancel(&self, id: &str) -> Result<Value, CancelRefused> {
        let mut inner = self.lock();
        let s = inner.map.get_mut(id).ok_or(CancelRefused::NotFound)?;
        let running = matches!(s.body["status"].as_str(), Some("queued" | "in_progress"));
        if !running || s.body["background"] != true {
            return Err(CancelRefused::NotRunning);
        }
        if let Some(t) = s.task.take() {
            t.abort();
        }
        s.body["status"] = Value::from("cancelled");
        Ok(s.body.clone())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_store_keeps_conversations_forgets_the_oldest_and_cancels_only_running_work() {
        let store = ResponseStore::default();
        let m = Message {
            role: Cow::Borrowed("user"),
            parts: vec![Cow::Borrowed("hi")],
        };
        store.put(
            "a",
            json!({"status": "completed", "background": false}),
            vec![owned(&m)],
        );
        assert_eq!(store.conversation("a").unwrap()[0].parts, ["hi"]);
        assert_eq!(store.cancel("a"), Err(CancelRefused::NotRunning));
        assert_eq!(store.cancel("zz"), Err(CancelRefused::NotFound));
        store.put("b", json!({"status": "queued", "background": true}), vec![]);
        assert_eq!(store.cancel("b").unwrap()["status"], "cancelled");
        // Its task finishing later does not undo the cancel.
        store.put(
            "b",
            json!({"status": "completed", "background": true}),
            vec![],
        );
        assert_eq!(store.body("b").unwrap()["status"], "cancelled");
        for i in 0..CAPACITY {
            store.put(&format!("x{i}"), json!({}), vec![]);
        }
        assert!(store.body("a").is_none(), "the oldest went first");
        assert!(store.body(&format!("x{}", CAPACITY - 1)).is_some());
    }
}
