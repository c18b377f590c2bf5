//! Prefix artifacts: claim (first writer owns; a live owner's claim stands), extend (seal
//! the next artifact under the same owner, fenced by the parent's epoch), release,
//! forget (an unreferenced artifact idle long enough, fenced by its epoch), read-only
//! replicas, and migrate (CAS on the epoch; the target must hold a copy).
//!
//! A forgotten artifact may still be named as `parent` by a longer one: nothing but
//! `extend` reads a parent, and it refuses a missing one (`UnknownPrefix`), as for a
//! parent never claimed.

use super::{Outcome, Rejection};
use crate::command::{checkpoint_blocks, ArtifactSpec};
use crate::ids::{Epoch, Key, LeaseId, PrefixKey, Tier, WorkerId};
use crate::state::{Artifact, Directory, Location, Owner};

impl Directory {
    fn new_artifact(&self, spec: &ArtifactSpec) -> Artifact {
        Artifact {
            parent: spec.parent,
            blocks: spec.blocks,
            kv_type: spec.kv_type.clone(),
            size_bytes: spec.size_bytes,
            owner: None,
            epoch: Epoch(0),
            locations: Default::default(),
            ref_count: 0,
            needs_recompute: false,
            last_access_ms: self.now_ms,
            // One hash per checkpoint count, or none: a partial list would let a lookup
            // bound a prompt's shared length wrongly.
            checkpoints: if spec.checkpoints.len() == checkpoint_blocks(spec.blocks.1).count() {
                spec.checkpoints.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// Makes `owner` the owner of `key` (which must exist), moving the lease attachment.
    fn set_owner(&mut self, key: PrefixKey, owner: Owner) {
        let previous = self.artifacts.get(&key).and_then(|a| a.owner);
        if let Some(p) = previous {
            self.detach(p.lease, &Key::Prefix(key));
        }
        self.attach(owner.lease, Key::Prefix(key));
        let now = self.now_ms;
        if let Some(a) = self.artifacts.get_mut(&key) {
            a.owner = Some(owner);
            a.epoch = owner.epoch;
            a.needs_recompute = false;
            a.last_access_ms = now;
            a.locations.insert(Location {
                worker: owner.worker,
                tier: Tier::Gpu,
            });
        }
    }

    pub(super) fn claim(
        &mut self,
        key: PrefixKey,
        lease: LeaseId,
        spec: &ArtifactSpec,
        expect_epoch: Option<Epoch>,
        epoch: Epoch,
    ) -> Outcome {
        let worker = match self.live_lease(lease) {
            Ok(w) => w,
            Err(r) => return r.into(),
        };
        if !self.artifacts.contains_key(&key) {
            let fresh = self.new_artifact(spec);
            self.artifacts.insert(key, fresh);
        }
        let (current, owner) = match self.artifacts.get(&key) {
            Some(a) => (a.epoch, a.owner),
            None => return Rejection::UnknownPrefix(key).into(),
        };
        if let Some(given) = expect_epoch.filter(|&e| e != current) {
            return Rejection::StaleEpoch { current, given }.into();
        }
        match owner {
            Some(o) if o.lease == lease => Outcome::Owned {
                worker,
                epoch: o.epoch,
            },
            // A losing claim only makes the caller's copy a replica.
            Some(o) if self.lease_live(o.lease) => {
                if let Some(a) = self.artifacts.get_mut(&key) {
                    a.locations.insert(Location {
                        worker,
                        tier: Tier::Gpu,
                    });
                }
                Outcome::Held { owner: o }
            }
            _ => {
                self.set_owner(
                    key,
                    Owner {
                        worker,
                        lease,
                        epoch,
                    },
                );
                Outcome::Owned { worker, epoch }
            }
        }
    }

    pub(super) fn extend(
        &mut self,
        key: PrefixKey,
        spec: &ArtifactSpec,
        parent_epoch: Epoch,
        epoch: Epoch,
    ) -> Outcome {
        let Some(parent_key) = spec.parent else {
            return Rejection::UnknownPrefix(key).into();
        };
        let Some(parent) = self.artifacts.get(&parent_key) else {
            return Rejection::UnknownPrefix(parent_key).into();
        };
        if parent.epoch != parent_epoch {
            return Rejection::StaleEpoch {
                current: parent.epoch,
                given: parent_epoch,
            }
            .into();
        }
        let Some(owner) = parent.owner.filter(|o| self.lease_live(o.lease)) else {
            return Rejection::NoOwner(parent_key).into();
        };
        if let Some(o) = self.artifacts.get(&key).and_then(|a| a.owner) {
            if o.lease != owner.lease && self.lease_live(o.lease) {
                return Outcome::Held { owner: o };
            }
            if o.lease == owner.lease {
                return Outcome::Owned {
                    worker: o.worker,
                    epoch: o.epoch,
                };
            }
        }
        if !self.artifacts.contains_key(&key) {
            let fresh = self.new_artifact(spec);
            self.artifacts.insert(key, fresh);
        }
        self.set_owner(key, Owner { epoch, ..owner });
        Outcome::Owned {
            worker: owner.worker,
            epoch,
        }
    }

    /// Artifact `key` if its epoch is still `given`; else the rejection to answer (the
    /// artifacts' twin of `fenced_session`).
    fn fenced_artifact(&self, key: PrefixKey, given: Epoch) -> Result<&Artifact, Outcome> {
        match self.artifacts.get(&key) {
            None => Err(Rejection::UnknownPrefix(key).into()),
            Some(a) if a.epoch != given => Err(Rejection::StaleEpoch {
                current: a.epoch,
                given,
            }
            .into()),
            Some(a) => Ok(a),
        }
    }

    pub(super) fn release(&mut self, key: PrefixKey, given: Epoch, epoch: Epoch) -> Outcome {
        let a = match self.fenced_artifact(key, given) {
            Ok(a) => a,
            Err(rejected) => return rejected,
        };
        let Some(o) = a.owner else {
            return Rejection::NoOwner(key).into();
        };
        self.detach(o.lease, &Key::Prefix(key));
        if let Some(a) = self.artifacts.get_mut(&key) {
            a.owner = None;
            a.epoch = epoch;
        }
        Outcome::Released
    }

    /// Removes `key`'s artifact if its epoch is still `given`, no session is built on it
    /// and it was last accessed at least `idle_ms` before the directory's clock; its owner's
    /// lease lets go of it.
    pub(super) fn forget(&mut self, key: PrefixKey, given: Epoch, idle_ms: u64) -> Outcome {
        let a = match self.fenced_artifact(key, given) {
            Ok(a) => a,
            Err(rejected) => return rejected,
        };
        if a.ref_count > 0 {
            return Rejection::Referenced {
                key,
                refs: a.ref_count,
            }
            .into();
        }
        let since_ms = self.now_ms.saturating_sub(a.last_access_ms);
        if since_ms < idle_ms {
            return Rejection::RecentlyAccessed {
                key,
                since_ms,
                idle_ms,
            }
            .into();
        }
        if let Some(o) = a.owner {
            self.detach(o.lease, &Key::Prefix(key));
        }
        self.artifacts.remove(&key);
        Outcome::Forgotten
    }

    pub(super) fn replicate(&mut self, key: PrefixKey, worker: WorkerId, tier: Tier) -> Outcome {
        match self.artifacts.get_mut(&key) {
            Some(a) => {
                a.locations.insert(Location { worker, tier });
                Outcome::Replicated
            }
            None => Rejection::UnknownPrefix(key).into(),
        }
    }

    pub(super) fn migrate(
        &mut self,
        key: PrefixKey,
        from_epoch: Epoch,
        to_lease: LeaseId,
        epoch: Epoch,
    ) -> Outcome {
        let worker = match self.live_lease(to_lease) {
            Ok(w) => w,
            Err(r) => return r.into(),
        };
        let Some(a) = self.artifacts.get(&key) else {
            return Rejection::UnknownPrefix(key).into();
        };
        if a.epoch != from_epoch {
            return Rejection::StaleEpoch {
                current: a.epoch,
                given: from_epoch,
            }
            .into();
        }
        // The owner flips only once the KV is in place on the target.
        if !a.locations.iter().any(|l| l.worker == worker) {
            return Rejection::NotReady { key, worker }.into();
        }
        self.set_owner(
            key,
            Owner {
                worker,
                lease: to_lease,
                epoch,
            },
        );
        Outcome::Owned { worker, epoch }
    }
}
