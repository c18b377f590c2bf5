//! Stored responses (OpenAI Responses with `store: true`) by id: the worker whose engine
//! holds each one, under which lease, until when. Only that engine can continue the
//! response (`previous_response_id`), return it or cancel it, so routers send those there
//! and, once the worker is gone, answer with an error naming the lost response.
//!
//! When the worker's last lease lapses (a host too busy to renew it, or a dead worker), its
//! records wait for it, as its sessions do (`Directory::lapsed`): granted a lease again in
//! time, the worker takes them back; past that, they are lost. A revoked lease (the worker
//! left) loses them at once.
//!
//! Bounded twice: every record expires (`expires_at_ms`, dropped by `Tick`), and at most
//! [`MAX_RESPONSES`] are kept (the soonest to expire goes first). The expiry and lapse
//! indexes are derived from the records alone, so they are not part of a snapshot:
//! deserialising rebuilds them, and two maps with the same records are equal.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{LeaseId, WorkerId};

/// Most stored responses the directory keeps.
pub const MAX_RESPONSES: usize = 100_000;

/// Longest response id recorded (engines' ids are ~40 bytes).
pub const MAX_RESPONSE_ID_BYTES: usize = 256;

/// Where one stored response lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub worker: WorkerId,
    /// The worker's lease it was recorded under (moved to another live lease of the same
    /// worker if this one ends first).
    pub lease: LeaseId,
    pub stored_at_ms: u64,
    pub expires_at_ms: u64,
    /// The worker's last lease ended: its engine, and the response with it, is presumed
    /// gone. Kept until it expires so a follow-up learns the response was lost.
    #[serde(default)]
    pub lost: bool,
    /// The worker's last lease lapsed: until then the record waits for the worker to be
    /// granted a lease again (and stays routable to it), then it is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lapsed_until_ms: Option<u64>,
}

/// Stored responses by id (read through `Deref` as the ordered map), with their expiry
/// order. Changes go through [`ResponseMap::insert`] and the other methods so the index
/// stays true.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseMap {
    by_id: BTreeMap<String, StoredResponse>,
    by_expiry: BTreeSet<(u64, String)>,
    /// The lapsed records, by the end of their wait.
    by_lapse: BTreeSet<(u64, String)>,
}

impl ResponseMap {
    /// Adds or replaces `id`'s record, then drops the soonest to expire while over
    /// [`MAX_RESPONSES`]; how many it dropped.
    pub fn insert(&mut self, id: String, r: StoredResponse) -> usize {
        self.remove(&id);
        self.index(&id, &r);
        self.by_id.insert(id, r);
        let mut dropped = 0;
        while self.by_id.len() > MAX_RESPONSES {
            let Some((_, oldest)) = self.by_expiry.first().cloned() else {
                break;
            };
            self.remove(&oldest);
            dropped += 1;
        }
        dropped
    }

    fn index(&mut self, id: &str, r: &StoredResponse) {
        self.by_expiry.insert((r.expires_at_ms, id.to_owned()));
        if let Some(until) = r.lapsed_until_ms {
            self.by_lapse.insert((until, id.to_owned()));
        }
    }

    /// Removes `id`'s record.
    pub fn remove(&mut self, id: &str) -> Option<StoredResponse> {
        let r = self.by_id.remove(id)?;
        self.by_expiry.remove(&(r.expires_at_ms, id.to_owned()));
        if let Some(until) = r.lapsed_until_ms {
            self.by_lapse.remove(&(until, id.to_owned()));
        }
        Some(r)
    }

    /// When the first record expires or ends its wait for a lapsed worker.
    pub fn first_expiry_ms(&self) -> Option<u64> {
        let expiry = self.by_expiry.first().map(|(at, _)| *at);
        let lapse = self.by_lapse.first().map(|(at, _)| *at);
        expiry.into_iter().chain(lapse).min()
    }

    /// Drops every record expired at `now_ms`, and marks lost those whose worker did not
    /// come back in time; how many were dropped.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        while self.by_lapse.first().is_some_and(|(at, _)| *at <= now_ms) {
            if let Some((_, id)) = self.by_lapse.pop_first() {
                if let Some(r) = self.by_id.get_mut(&id) {
                    r.lapsed_until_ms = None;
                    r.lost = true;
                }
            }
        }
        let mut n = 0;
        while let Some((_, id)) = self.by_expiry.first().filter(|(at, _)| *at <= now_ms) {
            let id = id.clone();
            self.remove(&id);
            n += 1;
        }
        n
    }

    /// The records held under `lease`, for the end of that lease: each is moved to
    /// `successor` (another live lease of its worker); without one, it waits for the
    /// worker until `lapsed_until_ms` (the lease lapsed) or is lost at once (`None`: it
    /// was revoked).
    pub fn lease_ended(
        &mut self,
        lease: LeaseId,
        successor: Option<LeaseId>,
        lapsed_until_ms: Option<u64>,
    ) {
        let mut lapsed = Vec::new();
        for (id, r) in self.by_id.iter_mut().filter(|(_, r)| r.lease == lease) {
            match (successor, lapsed_until_ms) {
                (Some(next), _) => r.lease = next,
                (None, Some(until)) => {
                    r.lapsed_until_ms = Some(until);
                    lapsed.push((until, id.clone()));
                }
                (None, None) => r.lost = true,
            }
        }
        self.by_lapse.extend(lapsed);
    }

    /// Gives `worker`'s lapsed records back to it under `lease` (granted at `now_ms`).
    pub fn take_back(&mut self, worker: WorkerId, lease: LeaseId, now_ms: u64) {
        let mine: Vec<(u64, String)> = self
            .by_lapse
            .iter()
            .filter(|(until, id)| {
                *until > now_ms && self.by_id.get(id).is_some_and(|r| r.worker == worker)
            })
            .cloned()
            .collect();
        for key in mine {
            self.by_lapse.remove(&key);
            if let Some(r) = self.by_id.get_mut(&key.1) {
                r.lapsed_until_ms = None;
                r.lease = lease;
            }
        }
    }
}

impl Deref for ResponseMap {
    type Target = BTreeMap<String, StoredResponse>;

    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

impl Serialize for ResponseMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.by_id.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ResponseMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let records = BTreeMap::<String, StoredResponse>::deserialize(d)?;
        let mut map = Self::default();
        for (id, r) in &records {
            map.index(id, r);
        }
        map.by_id = records;
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(expires_at_ms: u64) -> StoredResponse {
        StoredResponse {
            worker: WorkerId(1),
            lease: LeaseId(7),
            stored_at_ms: 0,
            expires_at_ms,
            lost: false,
            lapsed_until_ms: None,
        }
    }

    #[test]
    fn records_expire_in_order_and_the_count_is_capped() {
        let mut m = ResponseMap::default();
        m.insert("a".into(), stored(10));
        m.insert("b".into(), stored(20));
        m.insert("a".into(), stored(30)); // replaced: its old expiry goes with it
        assert_eq!(m.expire(25), 1);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a"]);
        for i in 0..MAX_RESPONSES + 3 {
            m.insert(format!("r{i}"), stored(100 + i as u64));
        }
        assert_eq!(m.len(), MAX_RESPONSES);
        assert!(!m.contains_key("a"), "the soonest to expire goes first");
        assert!(!m.contains_key("r0") && !m.contains_key("r2"));
        assert!(m.contains_key("r3"));
    }

    #[test]
    fn a_snapshot_rebuilds_the_expiry_order() {
        let mut m = ResponseMap::default();
        m.insert("a".into(), stored(10));
        m.insert("b".into(), stored(5));
        let text = serde_json::to_string(&m).unwrap();
        let mut back: ResponseMap = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.expire(5), 1);
        assert_eq!(back.keys().collect::<Vec<_>>(), ["a"]);
    }
}
