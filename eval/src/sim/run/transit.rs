//! A step on its way: KV moving to its decode worker, sequences queued on the engines,
//! engine steps and the tokens they produce, and the step's end.

use std::sync::Arc;

use ownerserve_planner::ids::WorkerId;
use ownerserve_shim::sim::scheduler::{CachedRun, NewSeq, SeqId};

use super::super::events::Event;
use super::super::stats::StepRecord;

use super::*;

impl Sim<'_> {
    pub(super) fn new_seq(
        &mut self,
        id: usize,
        worker: usize,
        max_tokens: u32,
        choice: u32,
    ) -> Option<NewSeq> {
        let r = self.reqs.get_mut(id)?.as_mut()?;
        let e = &mut self.engines[worker];
        // Counted from here until it is admitted (`step_end`).
        r.placement.preempted_while_waiting = e.preempted;
        let seq = e.next_seq;
        e.next_seq += 1;
        self.seqs.insert((worker, seq), id);
        Some(NewSeq {
            id: SeqId(seq),
            prompt: r.prompt.clone(),
            max_tokens,
            eos_after: None,
            stop: Arc::from(Vec::<String>::new()),
            stream_seed: (r.session as u64) << 32 ^ (r.step as u64) << 8 ^ u64::from(choice),
            arrival_s: self.now_s,
            // A returning step goes ahead of new prompts when the lifecycle runs (the
            // router's `return_priority`).
            priority: if self.lifecycle.on && r.step > 0 {
                lifecycle::RETURN_PRIORITY
            } else {
                0
            },
        })
    }

    /// Queues the request's sequences on its decode worker.
    pub(super) fn submit(&mut self, id: usize, worker: usize, hold: bool) {
        let Some(r) = self.reqs.get(id).and_then(Option::as_ref) else {
            return;
        };
        let st = &self.wl.sessions[r.session].steps[r.step];
        let (samples, max_tokens) = (st.samples.max(1), st.output_tokens.max(1));
        for choice in 0..samples {
            let Some(seq) = self.new_seq(id, worker, max_tokens, choice) else {
                return;
            };
            let sched = &mut self.engines[worker].sched;
            // `check` passed when the step was placed, so adding cannot fail.
            let _ = if hold {
                sched.add_holding_prefix(seq)
            } else {
                sched.add(seq)
            };
        }
        self.kick(worker);
    }

    pub(super) fn submit_prefill_leg(&mut self, id: usize, p: usize) {
        if let Some(seq) = self.new_seq(id, p, 1, 0) {
            let _ = self.engines[p].sched.add(seq);
            self.kick(p);
        }
    }

    /// Pulls the leading `tokens` of the request's prompt from `source` to its worker.
    pub(super) fn start_transfer(&mut self, id: usize, source: usize, tokens: u64, why: Move) {
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        let worker = r.worker;
        let usable = (tokens.min(r.prompt.len() as u64) / u64::from(self.block)) as usize;
        let chain = &r.hashes[..usable.min(r.hashes.len())];
        let local = self.engines[worker].sched.cached_prefix(chain);
        let wanted = chain.get(local..).unwrap_or_default();
        let run = match self.engines.get(source) {
            Some(e) if source != worker => e.sched.read_cached(wanted),
            _ => CachedRun::default(),
        };
        let bytes = run.blocks as u64 * self.engines[worker].block_bytes;
        let link = self.engines[worker].link;
        // The copies a worker serves share its NIC: this one starts once those queued
        // before it are sent (the planner prices each copy as if the link were its own).
        let mut start = self.now_s;
        if bytes > 0 {
            if let Some(src) = self.engines.get_mut(source) {
                start = start.max(src.nic_free_s);
                src.nic_free_s = start + bytes as f64 / link.bytes_per_s;
            }
        }
        let took = start - self.now_s + link.transfer_s(bytes);
        match why {
            Move::PrefillToDecode => self.kv.prefill_to_decode += bytes,
            Move::Fetch => self.kv.fetch += bytes,
            Move::Migrate { .. } => self.kv.migration += bytes,
        }
        // The receiver holds blocks for the copy until it lands, evicting cached prefixes now.
        let (reserved, evictions) = self.engines[worker].sched.reserve(run.blocks);
        let role = self.engines[worker].role;
        self.residency.apply(self.now_s, role, &evictions);
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        r.phase = Phase::Transfer;
        r.transit = Some(InTransit {
            local,
            run,
            why,
            reserved,
        });
        // A fetch or move reaches its worker's queue only once its copy lands, as a remote
        // prefill's decode leg does: until then it is counted as heading there.
        self.engines[worker].ledger.heading(&mut r.charged);
        self.queue
            .push(self.now_s + took, Event::Arrived { req: id });
    }

    pub(super) fn arrived(&mut self, id: usize) {
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        r.phase = Phase::Decode;
        let worker = r.worker;
        self.engines[worker].ledger.arrived(&mut r.charged);
        let Some(t) = r.transit.take() else {
            self.submit(id, worker, false);
            return;
        };
        self.engines[worker].sched.unreserve(&t.reserved);
        let chain = &r.hashes[..(t.local + t.run.blocks).min(r.hashes.len())];
        let received: Vec<u64> = chain[t.local..].to_vec();
        let local: Vec<u64> = chain[..t.local].to_vec();
        if let Move::Migrate { source } = t.why {
            let moved = self.engines[source].sched.drop_cached(&received);
            let role = self.engines[source].role;
            self.residency.apply(self.now_s, role, &moved.events);
            if let Some(key) = r.artifact_key {
                self.dir.move_prefix(key, WorkerId(worker as u32));
            }
        }
        if t.run.blocks == 0 {
            self.submit(id, worker, false);
            return;
        }
        let sched = &mut self.engines[worker].sched;
        let pins = sched.pin(&local);
        let update = sched.insert_cached(
            t.run.parent.or(local.last().copied()),
            &received,
            &t.run.tokens,
        );
        let role = self.engines[worker].role;
        self.residency.apply(self.now_s, role, &update.events);
        self.submit(id, worker, true);
        self.engines[worker].sched.unpin(&pins);
    }

    /// Starts a step on an engine that is not stepping and has work.
    pub(super) fn kick(&mut self, worker: usize) {
        let e = &mut self.engines[worker];
        if e.stepping.is_some() || e.sched.is_idle() {
            return;
        }
        let out = e.sched.step(self.now_s);
        let Some(time) = out.time else {
            // Nothing to compute until a restore lands: an empty step ends then (what it
            // admitted is delivered at its end).
            if let Some(until) = out.idle_until_s {
                e.stepping = Some(out);
                self.queue.push(until, Event::StepEnd { worker });
            }
            // Else nothing runnable (waiting for blocks): the next change kicks it again.
            return;
        };
        let d = time.total_s;
        e.busy_s += d;
        if out.work.decode_seqs > 0 {
            let slot = usize::from(out.work.prefill_tokens == 0);
            self.decode_steps[slot].0 += d * out.work.decode_seqs as f64;
            self.decode_steps[slot].1 += out.work.decode_seqs;
        }
        e.stepping = Some(out);
        self.queue.push(self.now_s + d, Event::StepEnd { worker });
    }

    pub(super) fn step_end(&mut self, worker: usize) {
        let Some(out) = self.engines[worker].stepping.take() else {
            return;
        };
        let now = self.now_s;
        self.preemptions += u64::from(out.preempted);
        self.engines[worker].preempted += u64::from(out.preempted);
        let preempted = self.engines[worker].preempted;
        let role = self.engines[worker].role;
        self.residency.apply(now, role, &out.cache_events);
        self.host_restored_bytes += out.restored_tokens * self.kv_bytes_per_token;
        for a in &out.admitted {
            if let Some(&id) = self.seqs.get(&(worker, a.seq.0)) {
                if let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) {
                    // Reuse is counted where the prompt is computed: a remote prefill's
                    // prefill worker, else the decode worker (KV it fetched counts).
                    match r.phase {
                        Phase::Prefill { prefill, .. } if prefill == worker => {
                            r.cached_tokens = a.cached_tokens;
                            r.restored_tokens = a.restored_tokens;
                            r.prefilled_remotely = true;
                            r.placement.admit_wait_s = a.queue_s;
                            r.placement.preempted_while_waiting =
                                preempted.saturating_sub(r.placement.preempted_while_waiting);
                        }
                        _ if r.worker == worker && !r.prefilled_remotely => {
                            if a.cached_tokens >= r.cached_tokens {
                                r.restored_tokens = a.restored_tokens;
                            }
                            r.cached_tokens = r.cached_tokens.max(a.cached_tokens);
                            r.placement.admit_wait_s = a.queue_s;
                            r.placement.preempted_while_waiting =
                                preempted.saturating_sub(r.placement.preempted_while_waiting);
                        }
                        _ => {}
                    }
                }
            }
        }
        for t in &out.tokens {
            if t.finish.is_some() && self.resend_done(worker, t.seq.0) {
                continue;
            }
            let Some(&id) = self.seqs.get(&(worker, t.seq.0)) else {
                continue;
            };
            if t.finish.is_some() {
                self.seqs.remove(&(worker, t.seq.0));
            }
            self.token(id, worker, t.finish.is_some());
        }
        self.kick(worker);
    }

    pub(super) fn token(&mut self, id: usize, worker: usize, finished: bool) {
        let now = self.now_s;
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        if let Phase::Prefill { prefill, started_s } = r.phase {
            if worker == prefill && finished {
                if let Some((p, leg)) = r.leg_charged.take() {
                    self.engines[p].ledger.end(leg);
                }
                if let (Some(predicted), true) = (r.predicted_prefill_s, self.opts.calibrate) {
                    self.policy.observe_prefill(
                        WorkerId(prefill as u32),
                        predicted,
                        now - started_s,
                    );
                }
                let tokens = r.prompt.len() as u64;
                self.start_transfer(id, prefill, tokens, Move::PrefillToDecode);
            }
            return;
        }
        if r.first_token_s.is_none() {
            r.first_token_s = Some(now);
            let e = &mut self.engines[r.worker];
            e.ledger.prefill_done(&mut r.charged);
            r.decode_slot = Some(e.decodes.start(now, r.prompt.len() as u64));
        }
        r.last_token_s = now;
        r.tokens += 1;
        if !finished {
            return;
        }
        r.choices_left = r.choices_left.saturating_sub(1);
        if r.choices_left > 0 {
            return;
        }
        let Some(r) = self.reqs.get_mut(id).and_then(Option::take) else {
            return;
        };
        let samples = self.wl.sessions[r.session].steps[r.step].samples.max(1);
        let per_choice = (r.tokens / samples).max(1);
        let first = r.first_token_s.unwrap_or(now);
        if self.opts.calibrate {
            // How long its sequences held their KV on the decode worker.
            self.policy
                .observe_decode(WorkerId(r.worker as u32), now - first);
        }
        self.steps.push(StepRecord {
            session: r.session,
            step: r.step,
            issued_s: r.issued_s,
            ttft_s: first - r.issued_s,
            tpot_s: if per_choice > 1 {
                (r.last_token_s - first) / f64::from(per_choice - 1)
            } else {
                f64::NAN
            },
            latency_s: now - r.issued_s,
            prompt_tokens: r.prompt.len() as u32,
            cached_tokens: r.cached_tokens,
            restored_tokens: r.restored_tokens,
            rejected: false,
            placement: r.placement,
        });
        let e = &mut self.engines[r.worker];
        if let Some(slot) = r.decode_slot {
            e.decodes.end(slot);
        }
        e.ledger.end(r.charged);
        self.end_idle_tracking(r.session, r.step, now);
        self.step_completed(r.session, r.step, now);
    }
}
