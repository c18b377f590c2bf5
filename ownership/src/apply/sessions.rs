//! Sessions: the decode owner of an agent session, on top of a prefix artifact; forks are
//! copy-on-write branches sharing the parent's prefix (its `ref_count` counts them).

use super::{Outcome, Rejection};
use crate::ids::{Epoch, Key, LeaseId, PrefixKey, SessionId};
use crate::state::{Directory, Owner, Session};

impl Directory {
    fn add_ref(&mut self, prefix: Option<PrefixKey>, delta: i64) {
        if let Some(a) = prefix.and_then(|p| self.artifacts.get_mut(&p)) {
            a.ref_count = (i64::from(a.ref_count) + delta).max(0) as u32;
        }
    }

    /// Drops a session, its lease attachment and its prefix reference.
    pub(super) fn remove_session(&mut self, id: &SessionId) {
        let Some(s) = self.sessions.remove(id) else {
            return;
        };
        if let Some(o) = s.owner {
            self.detach(o.lease, &Key::Session(id.clone()));
        }
        self.add_ref(s.prefix, -1);
    }

    #[expect(clippy::too_many_arguments, reason = "one per field of the command")]
    pub(super) fn set_decode_owner(
        &mut self,
        id: &SessionId,
        lease: LeaseId,
        prefix: Option<PrefixKey>,
        tail_tokens: u32,
        predicted_tool_gap_ms: Option<u64>,
        expect_epoch: Option<Epoch>,
        epoch: Epoch,
    ) -> Outcome {
        let worker = match self.live_lease(lease) {
            Ok(w) => w,
            Err(r) => return r.into(),
        };
        if let Some(p) = prefix.filter(|p| !self.artifacts.contains_key(p)) {
            return Rejection::UnknownPrefix(p).into();
        }
        let now = self.now_ms;
        let existing = self.sessions.get(id).map(|s| (s.epoch, s.owner, s.prefix));
        if let Some((current, _, _)) = existing {
            if let Some(given) = expect_epoch.filter(|&e| e != current) {
                return Rejection::StaleEpoch { current, given }.into();
            }
        }
        if existing.is_some_and(|(_, o, _)| o.is_some_and(|o| o.lease != lease))
            && self.sessions.get(id).is_some_and(|s| s.pinned)
        {
            return Rejection::Pinned(id.clone()).into();
        }
        let owner = match existing {
            Some((_, Some(o), _)) if o.lease == lease => o,
            Some((_, Some(o), _)) if expect_epoch.is_none() && self.lease_live(o.lease) => {
                return Outcome::Held { owner: o };
            }
            Some((_, previous, _)) => {
                if let Some(p) = previous {
                    self.detach(p.lease, &Key::Session(id.clone()));
                }
                Owner {
                    worker,
                    lease,
                    epoch,
                }
            }
            None => Owner {
                worker,
                lease,
                epoch,
            },
        };
        let old_prefix = existing.and_then(|(_, _, p)| p);
        if existing.is_none() || old_prefix != prefix {
            self.add_ref(old_prefix, -1);
            self.add_ref(prefix, 1);
        }
        self.attach(lease, Key::Session(id.clone()));
        let session = self.sessions.entry(id.clone()).or_insert_with(|| Session {
            owner: None,
            epoch: Epoch(0),
            prefix: None,
            tail_tokens: 0,
            parent: None,
            predicted_tool_gap_ms: None,
            last_access_ms: now,
            pinned: false,
            root: None,
            agent_parent: None,
        });
        session.owner = Some(owner);
        session.epoch = owner.epoch;
        session.prefix = prefix;
        session.tail_tokens = tail_tokens;
        session.predicted_tool_gap_ms = predicted_tool_gap_ms;
        session.last_access_ms = now;
        Outcome::Owned {
            worker,
            epoch: owner.epoch,
        }
    }

    pub(super) fn fork(
        &mut self,
        parent: &SessionId,
        child: &SessionId,
        lease: LeaseId,
        parent_epoch: Epoch,
        epoch: Epoch,
    ) -> Outcome {
        let worker = match self.live_lease(lease) {
            Ok(w) => w,
            Err(r) => return r.into(),
        };
        let Some(p) = self.sessions.get(parent) else {
            return Rejection::UnknownSession(parent.clone()).into();
        };
        if p.epoch != parent_epoch {
            return Rejection::StaleEpoch {
                current: p.epoch,
                given: parent_epoch,
            }
            .into();
        }
        if self.sessions.contains_key(child) {
            return Rejection::SessionExists(child.clone()).into();
        }
        let prefix = p.prefix;
        let owner = Owner {
            worker,
            lease,
            epoch,
        };
        self.add_ref(prefix, 1);
        self.attach(lease, Key::Session(child.clone()));
        let now = self.now_ms;
        self.sessions.insert(
            child.clone(),
            Session {
                owner: Some(owner),
                epoch,
                prefix,
                tail_tokens: 0,
                parent: Some(parent.clone()),
                predicted_tool_gap_ms: None,
                last_access_ms: now,
                pinned: false,
                root: None,
                agent_parent: None,
            },
        );
        Outcome::Owned { worker, epoch }
    }

    /// Records session `id`'s root and parent agent (labels: no owner moves). A root equal
    /// to the session itself is kept as none.
    pub(super) fn label_session(
        &mut self,
        id: &SessionId,
        root: Option<&SessionId>,
        parent: Option<&SessionId>,
    ) -> Outcome {
        let Some(s) = self.sessions.get_mut(id) else {
            return Rejection::UnknownSession(id.clone()).into();
        };
        s.root = root.filter(|r| *r != id).cloned();
        s.agent_parent = parent.cloned();
        Outcome::Labelled
    }

    /// Session `id` if its epoch is still `given`; else the rejection to answer.
    fn fenced_session(&mut self, id: &SessionId, given: Epoch) -> Result<&mut Session, Outcome> {
        match self.sessions.get_mut(id) {
            None => Err(Rejection::UnknownSession(id.clone()).into()),
            Some(s) if s.epoch != given => Err(Rejection::StaleEpoch {
                current: s.epoch,
                given,
            }
            .into()),
            Some(s) => Ok(s),
        }
    }

    pub(super) fn pin_session(&mut self, id: &SessionId, given: Epoch, pinned: bool) -> Outcome {
        let s = match self.fenced_session(id, given) {
            Ok(s) => s,
            Err(rejected) => return rejected,
        };
        s.pinned = pinned;
        match s.owner {
            Some(o) => Outcome::Owned {
                worker: o.worker,
                epoch: o.epoch,
            },
            None => Outcome::Released,
        }
    }

    pub(super) fn demote_session(
        &mut self,
        id: &SessionId,
        given: Epoch,
        idle_ms: Option<u64>,
    ) -> Outcome {
        let now = self.now_ms;
        let s = match self.fenced_session(id, given) {
            Ok(s) => s,
            Err(rejected) => return rejected,
        };
        let since_ms = now.saturating_sub(s.last_access_ms);
        if let Some(idle_ms) = idle_ms.filter(|&idle| since_ms < idle) {
            return Rejection::RecentlyWritten {
                session: id.clone(),
                since_ms,
                idle_ms,
            }
            .into();
        }
        let Some(owner) = s.owner.take() else {
            return Outcome::Released;
        };
        s.tail_tokens = 0;
        self.detach(owner.lease, &Key::Session(id.clone()));
        Outcome::Released
    }

    pub(super) fn end_session(&mut self, id: &SessionId, given: Epoch) -> Outcome {
        if let Err(rejected) = self.fenced_session(id, given) {
            return rejected;
        }
        self.remove_session(id);
        Outcome::SessionEnded
    }
}
