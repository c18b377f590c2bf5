//! KV leases of prefill legs: the prompt blocks a prefill leg pinned for its decode leg,
//! by request id, until the decode leg pulls them or the lease runs out (vLLM's
//! `kv_lease_duration`). Pure: time is a [`Duration`] since the engine started, handed in
//! by the actor; the blocks handed back are for the caller to unpin.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::block_pool::BlockId;

#[derive(Debug)]
struct Lease {
    blocks: Vec<BlockId>,
    generation: u64,
}

/// Live leases, by request id.
#[derive(Debug)]
pub struct Leases {
    ttl: Duration,
    by_request: HashMap<String, Lease>,
    /// Expiry order. The ttl is fixed and time only grows, so pushing at the back keeps
    /// it sorted; entries of leases already taken or replaced are skipped by generation.
    expiry: VecDeque<(Duration, String, u64)>,
    next_generation: u64,
}

impl Leases {
    /// No leases; each granted one lasts `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            by_request: HashMap::new(),
            expiry: VecDeque::new(),
            next_generation: 0,
        }
    }

    /// Leases `blocks` to `request_id` from `now`; returns the blocks of a lease it
    /// replaces (a reused request id).
    pub fn grant(
        &mut self,
        request_id: String,
        blocks: Vec<BlockId>,
        now: Duration,
    ) -> Option<Vec<BlockId>> {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.expiry
            .push_back((now + self.ttl, request_id.clone(), generation));
        self.by_request
            .insert(request_id, Lease { blocks, generation })
            .map(|old| old.blocks)
    }

    /// Ends `request_id`'s lease (its blocks were pulled).
    pub fn take(&mut self, request_id: &str) -> Option<Vec<BlockId>> {
        self.by_request.remove(request_id).map(|l| l.blocks)
    }

    /// Ends every lease due at `now`; returns their blocks.
    pub fn expire(&mut self, now: Duration) -> Vec<BlockId> {
        let mut freed = Vec::new();
        while let Some((due, _, _)) = self.expiry.front() {
            if *due > now {
                break;
            }
            let Some((_, id, generation)) = self.expiry.pop_front() else {
                break;
            };
            let live = self
                .by_request
                .get(&id)
                .is_some_and(|l| l.generation == generation);
            if live {
                if let Some(lease) = self.by_request.remove(&id) {
                    freed.extend(lease.blocks);
                }
            }
        }
        freed
    }

    /// Leases alive.
    pub fn len(&self) -> usize {
        self.by_request.len()
    }

    /// Whether no lease is alive.
    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::block_pool::BlockPool;

    fn ids(n: u32) -> Vec<BlockId> {
        let mut pool = BlockPool::new(n);
        (0..n)
            .map(|_| pool.allocate(&mut Vec::new()).unwrap())
            .collect()
    }

    #[test]
    fn a_lease_ends_when_taken_or_when_it_expires() {
        let b = ids(3);
        let s = Duration::from_secs;
        let mut leases = Leases::new(s(30));
        assert_eq!(leases.grant("r1".into(), vec![b[0]], s(0)), None);
        assert_eq!(leases.grant("r2".into(), vec![b[1]], s(10)), None);
        assert_eq!(leases.take("r1"), Some(vec![b[0]]));
        assert_eq!(leases.take("r1"), None);
        assert_eq!(leases.expire(s(39)), vec![]);
        assert_eq!(leases.expire(s(40)), vec![b[1]]);
        assert!(leases.is_empty());
    }

    #[test]
    fn a_reused_request_id_replaces_the_lease_and_restarts_its_clock() {
        let b = ids(2);
        let s = Duration::from_secs;
        let mut leases = Leases::new(s(30));
        leases.grant("r".into(), vec![b[0]], s(0));
        assert_eq!(
            leases.grant("r".into(), vec![b[1]], s(20)),
            Some(vec![b[0]])
        );
        assert_eq!(leases.expire(s(30)), vec![], "the old expiry is stale");
        assert_eq!(leases.len(), 1);
        assert_eq!(leases.expire(s(50)), vec![b[1]]);
    }
}
