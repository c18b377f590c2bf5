//! Idle sessions (the router's `Sessions`): the lease each earns from its tool gaps, and
//! the demotion of one idle past it.

use ownerserve_planner::ewma::GapLease;

use super::super::events::Event;

use super::*;

impl Sim<'_> {
    pub(super) fn start_idle_tracking(
        &mut self,
        session: usize,
        worker: usize,
        hashes: &[u64],
        now: f64,
    ) {
        let tokens = hashes.len() as u64 * u64::from(self.block);
        let sealed_tokens = self.model.prefix_state(tokens, self.block).sealed_tokens;
        let i = &mut self.idle[session];
        i.tokens = tokens;
        if let Some(since) = i.idle_since_s.take() {
            let gap = ((now - since) * 1e3).max(0.0) as u64;
            i.lease.observe_gap(gap);
            i.life.observe_gap(gap);
            self.lifecycle.fleet_gaps.observe(i.life.ending, gap);
            self.lifecycle.came_back += 1;
        }
        i.in_flight += 1;
        i.owner = worker;
        let first_tail = (sealed_tokens / u64::from(self.block.max(1))) as usize;
        i.tail = hashes[first_tail.min(hashes.len())..].to_vec();
    }

    /// `session`'s step `step` ended at `now`: with nothing else in flight it parks, its gap
    /// waiting on how that step's response ended.
    pub(super) fn end_idle_tracking(&mut self, session: usize, step: usize, now: f64) {
        let ending = self.wl.sessions[session]
            .steps
            .get(step)
            .map_or(Default::default(), |st| st.ending);
        let i = &mut self.idle[session];
        i.in_flight = i.in_flight.saturating_sub(1);
        if i.in_flight == 0 {
            i.idle_since_s = Some(now);
            i.life.ending = ending;
            i.generation += 1;
            let ttl = i.lease.ttl_ms() as f64 / 1e3;
            let generation = i.generation;
            self.queue.push(
                now + ttl + 1e-6,
                Event::IdleCheck {
                    session,
                    generation,
                },
            );
            self.lifecycle_park(session, now);
        }
    }

    /// The session went idle past its lease: the directory drops its owner and the owner
    /// drops the unsealed tail (the router's demotion sweep).
    pub(super) fn idle_check(&mut self, session: usize, generation: u64) {
        let i = &self.idle[session];
        if i.generation != generation || i.in_flight > 0 || i.idle_since_s.is_none() {
            return;
        }
        let (owner, tail) = (i.owner, i.tail.clone());
        let name = self.wl.sessions[session].id.as_str();
        self.dir.demote(name);
        let dropped = self.engines[owner].sched.drop_cached(&tail);
        let role = self.engines[owner].role;
        self.residency.apply(self.now_s, role, &dropped.events);
        let template = GapLease::new(
            self.opts.lease_factor,
            self.opts.lease_min_ms,
            self.opts.lease_max_ms,
        );
        let i = &mut self.idle[session];
        i.lease = template;
        i.idle_since_s = None;
        i.tail.clear();
        i.life.end();
        self.lifecycle.ended += 1;
    }
}
