//! Leases: grant, keep-alive (renewing every attached key at once, etcd style), revoke, and
//! the expiry cascade run by `Tick`: a dead lease's prefixes pass to a live worker holding a
//! copy (new epoch) or are marked for recompute; its sessions follow their prefix's new
//! owner, or wait unowned (`Directory::lapsed`) for three of the lease's TTLs: a worker
//! granted a lease again within them takes back those nobody claimed meanwhile (a new
//! epoch: a host too busy to renew in time is not a dead worker), and past them they end,
//! releasing their fork reference; its stored responses pass to another live lease of the
//! same worker, or wait for it alike (no other engine holds them) and are lost after; a
//! revoked lease (the worker left) loses them at once. At version 1 (`crate::version`,
//! 0.1.0's rules) a lapsed lease's sessions and stored responses are lost at once.

use super::{Outcome, Rejection};
use crate::ids::{Epoch, Key, LeaseId, SessionId, WorkerId};
use crate::state::{Directory, LapsedOwner, Lease, Owner};
use crate::version::Version;

impl Directory {
    pub(super) fn grant(&mut self, lease: LeaseId, worker: WorkerId, ttl_ms: u64) -> Outcome {
        let expires_at_ms = self.now_ms.saturating_add(ttl_ms);
        self.leases.insert(
            lease,
            Lease {
                worker,
                ttl_ms,
                expires_at_ms,
                keys: Default::default(),
            },
        );
        self.take_back_lapsed(lease, worker);
        self.responses.take_back(worker, lease, self.now_ms);
        Outcome::LeaseGranted {
            lease,
            expires_at_ms,
        }
    }

    pub(super) fn keep_alive(&mut self, lease: LeaseId) -> Outcome {
        if let Err(r) = self.live_lease(lease) {
            return r.into();
        }
        let now = self.now_ms;
        match self.leases.get_mut(&lease) {
            Some(l) => {
                l.expires_at_ms = now.saturating_add(l.ttl_ms);
                Outcome::LeaseRenewed {
                    expires_at_ms: l.expires_at_ms,
                }
            }
            None => Rejection::UnknownLease(lease).into(),
        }
    }

    pub(super) fn revoke(&mut self, lease: LeaseId, epoch: Epoch) -> Outcome {
        if !self.leases.contains_key(&lease) {
            return Rejection::UnknownLease(lease).into();
        }
        Outcome::LeaseEnded {
            dropped: self.end_lease(lease, epoch, false),
        }
    }

    pub(super) fn tick(&mut self, epoch: Epoch) -> Outcome {
        let expired: Vec<LeaseId> = self
            .leases
            .keys()
            .copied()
            .filter(|&l| !self.lease_live(l))
            .collect();
        for &l in &expired {
            self.end_lease(l, epoch, true);
        }
        self.end_lapsed();
        self.responses.expire(self.now_ms);
        Outcome::Ticked { expired }
    }

    /// Removes a lease (`lapsed`: it expired, else it was revoked) and cascades to its
    /// keys; returns them.
    fn end_lease(&mut self, lease: LeaseId, epoch: Epoch, lapsed: bool) -> Vec<Key> {
        let Some(dead) = self.leases.remove(&lease) else {
            return Vec::new();
        };
        // Without another live lease the worker is gone, and so are its copies.
        let successor = self.live_lease_of(dead.worker);
        if successor.is_none() {
            for a in self.artifacts.values_mut() {
                a.locations.retain(|loc| loc.worker != dead.worker);
            }
        }
        // Its stored responses stay with the worker while it has another live lease, and
        // wait for it as its sessions do when it lapsed.
        let wait_until = (lapsed && self.version >= Version::LAPSED_OWNERS_AND_TENANTS)
            .then(|| self.lapse_until_ms(&dead));
        self.responses.lease_ended(lease, successor, wait_until);
        // `Key` orders prefixes before sessions, so sessions see their prefix's new owner.
        for key in &dead.keys {
            match key {
                Key::Prefix(p) => self.reassign_prefix(*p, lease, epoch),
                Key::Session(s) => self.reassign_session(s, &dead, lease, epoch),
            }
        }
        dead.keys.into_iter().collect()
    }

    /// A live lease of `worker`, if it has one (lowest id: deterministic).
    fn live_lease_of(&self, worker: WorkerId) -> Option<LeaseId> {
        self.leases
            .iter()
            .find(|(&id, l)| l.worker == worker && self.lease_live(id))
            .map(|(&id, _)| id)
    }

    /// A live lease of a worker holding a copy of `key`, if any (lowest id: deterministic).
    fn successor(&self, key: crate::ids::PrefixKey) -> Option<Owner> {
        let art = self.artifacts.get(&key)?;
        art.locations.iter().find_map(|loc| {
            self.live_lease_of(loc.worker).map(|lease| Owner {
                worker: loc.worker,
                lease,
                epoch: Epoch(0),
            })
        })
    }

    fn reassign_prefix(&mut self, key: crate::ids::PrefixKey, dead: LeaseId, epoch: Epoch) {
        if self
            .artifacts
            .get(&key)
            .and_then(|a| a.owner)
            .is_none_or(|o| o.lease != dead)
        {
            return;
        }
        let next = self.successor(key).map(|o| Owner { epoch, ..o });
        if let Some(o) = next {
            self.attach(o.lease, Key::Prefix(key));
        }
        if let Some(a) = self.artifacts.get_mut(&key) {
            a.owner = next;
            a.epoch = epoch;
            a.needs_recompute = next.is_none();
        }
    }

    fn reassign_session(&mut self, id: &SessionId, lease: &Lease, dead: LeaseId, epoch: Epoch) {
        let Some(s) = self.sessions.get(id) else {
            return;
        };
        if s.owner.is_none_or(|o| o.lease != dead) {
            return;
        }
        // Its prefix's new owner; else its own worker under another live lease (granted
        // again before this one was ended: the worker is alive).
        let lapsed_owners = self.version >= Version::LAPSED_OWNERS_AND_TENANTS;
        let follow = s
            .prefix
            .and_then(|p| self.artifacts.get(&p))
            .and_then(|a| a.owner)
            .filter(|o| self.lease_live(o.lease))
            .map(|o| Owner { epoch, ..o })
            .or_else(|| {
                let id = self.live_lease_of(lease.worker).filter(|_| lapsed_owners)?;
                Some(Owner {
                    worker: lease.worker,
                    lease: id,
                    epoch,
                })
            });
        match follow {
            Some(o) => {
                self.attach(o.lease, Key::Session(id.clone()));
                if let Some(s) = self.sessions.get_mut(id) {
                    s.owner = Some(o);
                    s.epoch = epoch;
                }
            }
            // Version 1 (0.1.0): its decode state died with the worker and nothing holds
            // its prefix.
            None if !lapsed_owners => self.remove_session(id),
            // Nothing else holds it: it waits, unowned and fenced by a new epoch, for its
            // worker to come back.
            None => {
                if let Some(s) = self.sessions.get_mut(id) {
                    s.owner = None;
                    s.epoch = epoch;
                }
                let until_ms = self.lapse_until_ms(lease);
                self.lapsed.insert(
                    id.clone(),
                    LapsedOwner {
                        worker: lease.worker,
                        until_ms,
                    },
                );
            }
        }
    }

    /// Until when what `lease` held waits for its worker to come back.
    fn lapse_until_ms(&self, lease: &Lease) -> u64 {
        self.now_ms
            .saturating_add(lease.ttl_ms.saturating_mul(LAPSED_TTLS))
    }

    /// Gives `worker`'s lapsed sessions that nobody claimed meanwhile back to it, under
    /// `lease` (its id is this command's epoch: a new one for each).
    fn take_back_lapsed(&mut self, lease: LeaseId, worker: WorkerId) {
        let now = self.now_ms;
        let mine: Vec<SessionId> = self
            .lapsed
            .iter()
            .filter(|(_, l)| l.worker == worker && l.until_ms > now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in mine {
            self.lapsed.remove(&id);
            let Some(s) = self.sessions.get_mut(&id).filter(|s| s.owner.is_none()) else {
                continue;
            };
            let epoch = Epoch(lease.0);
            s.owner = Some(Owner {
                worker,
                lease,
                epoch,
            });
            s.epoch = epoch;
            self.attach(lease, Key::Session(id));
        }
    }

    /// Ends the lapsed sessions whose worker did not come back in time (and forgets those
    /// claimed meanwhile).
    fn end_lapsed(&mut self) {
        let now = self.now_ms;
        let due: Vec<SessionId> = self
            .lapsed
            .iter()
            .filter(|(_, l)| l.until_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.lapsed.remove(&id);
            if self.sessions.get(&id).is_some_and(|s| s.owner.is_none()) {
                self.remove_session(&id);
            }
        }
    }
}

/// A lapsed owner's sessions wait this many of its lease's TTLs for it to come back.
pub const LAPSED_TTLS: u64 = 3;
