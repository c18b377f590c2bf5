//! The oracle: a clairvoyant reference policy for the simulator. It reads the simulator's
//! exact state (every engine's queued prefill work and cached blocks, not a scraped or
//! event-fed view) and knows every session's future (how far its context will grow, how
//! many steps remain, which forks follow). Each step goes to the worker where it would
//! start soonest: queued prefill tokens plus its own uncached tokens, plus a share of the
//! KV the sessions already placed there will still grow to. Long prefills go to a prefill
//! worker whose queue is empty. It is a greedy heuristic with perfect information, not a
//! proven optimum; `docs/EVALUATION.md` says where other policies beat it.

use std::collections::{HashMap, VecDeque};

use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::policy::{
    Decision, Dispatch, Policy, PolicyError, RouteRequest, WorkerView,
};

use crate::workload::Workload;

/// Prompts at least this long are prefilled on a prefill worker when the fleet has one.
const REMOTE_PREFILL_TOKENS: u32 = 2048;

/// What the oracle knows of one session.
#[derive(Debug, Clone)]
struct Future {
    /// Largest prompt + output the session reaches, tokens.
    peak_tokens: u64,
    steps: usize,
}

/// Clairvoyant placement; see the module doc.
#[derive(Debug)]
pub struct Oracle {
    futures: HashMap<String, Future>,
    /// Fork children of each parent session, in the order they will be issued.
    children: HashMap<String, VecDeque<String>>,
    /// Each placed session's first worker and steps seen.
    placed: HashMap<String, (WorkerId, usize)>,
    /// Lifetime KV (tokens) of the live sessions placed on each worker.
    committed: HashMap<WorkerId, u64>,
}

impl Oracle {
    /// An oracle for `workload` (the future it will be asked about).
    pub fn new(workload: &Workload) -> Self {
        let mut futures = HashMap::new();
        let mut children: HashMap<String, VecDeque<String>> = HashMap::new();
        for s in &workload.sessions {
            let peak = s
                .steps
                .iter()
                .map(|st| u64::from(st.input_tokens) + u64::from(st.output_tokens))
                .max()
                .unwrap_or(0);
            futures.insert(
                s.id.clone(),
                Future {
                    peak_tokens: peak,
                    steps: s.steps.len(),
                },
            );
            if let Some(f) = s.fork_of {
                if let Some(parent) = workload.sessions.get(f.session) {
                    children
                        .entry(parent.id.clone())
                        .or_default()
                        .push_back(s.id.clone());
                }
            }
        }
        Self {
            futures,
            children,
            placed: HashMap::new(),
            committed: HashMap::new(),
        }
    }

    fn load(&self, w: WorkerId) -> u64 {
        self.committed.get(&w).copied().unwrap_or(0)
    }

    /// Counts a step of `session` on `worker`; its KV is released after its last step.
    fn account(&mut self, session: &str, worker: WorkerId) {
        let Some(f) = self.futures.get(session).cloned() else {
            return;
        };
        let entry = self.placed.entry(session.to_owned()).or_insert_with(|| {
            *self.committed.entry(worker).or_insert(0) += f.peak_tokens;
            (worker, 0)
        });
        entry.1 += 1;
        if entry.1 >= f.steps {
            let (w, _) = *entry;
            let c = self.committed.entry(w).or_insert(0);
            *c = c.saturating_sub(f.peak_tokens);
        }
    }
}

impl Policy for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let name = req.session.unwrap_or_default().to_owned();
        // A fork names its parent; the child it starts is the parent's next one.
        let session = if req.fork {
            self.children
                .get_mut(&name)
                .and_then(VecDeque::pop_front)
                .unwrap_or(name)
        } else {
            name
        };
        let block = u64::from(req.block_size);
        let prompt = u64::from(req.prompt_tokens);
        let fresh = |w: &WorkerView| prompt.saturating_sub(u64::from(w.cached_blocks) * block);
        // Exact work ahead of this prompt there, plus its own uncached part, plus a share
        // of the KV the sessions placed there will still grow to (the future it knows).
        let cost = |w: &WorkerView| w.active_prefill_tokens + fresh(w) + self.load(w.id) / 16;
        let target = workers
            .iter()
            .filter(|w| w.takes_work() && w.role.serves_full_requests())
            .min_by_key(|w| (cost(w), w.id.0))
            .ok_or(PolicyError::NoHealthyWorker)?;
        let decision = self.split(fresh(target), workers, target.id);
        self.account(&session, decision.worker);
        Ok(decision)
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn needs_directory(&self) -> bool {
        true
    }
}

impl Oracle {
    /// Long prefills go to a prefill worker whose queue is empty, if the fleet has one.
    fn split(&self, fresh: u64, workers: &[WorkerView], d: WorkerId) -> Decision {
        // The simulator's load is exact, not scraped: a prefill worker with a queue would
        // delay this prompt, so only an idle-queued one takes it.
        let queued = |w: &WorkerView| w.load.map_or(0.0, |l| l.waiting);
        let prefill = workers
            .iter()
            .filter(|w| w.takes_work() && w.role == Role::Prefill && queued(w) == 0.0)
            .min_by_key(|w| (w.decoding(), w.id.0));
        match prefill {
            Some(p) if fresh >= u64::from(REMOTE_PREFILL_TOKENS) => Decision {
                worker: d,
                dispatch: Dispatch::Disaggregated { prefill: p.id },
                plan: None,
            },
            _ => Decision::single(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::step::{self, Needs, Owned, StepInput};

    use super::*;
    use crate::workload::{ForkOf, Loop, Session, Step, Workload};

    fn step(input: u32) -> Step {
        Step {
            output_tokens: 10,
            ..Step::of(input, vec![0; input.div_ceil(16) as usize])
        }
    }

    fn workload() -> Workload {
        let s = |id: &str, steps: Vec<Step>| Session {
            id: id.to_owned(),
            start_ms: 0.0,
            fork_of: None,
            steps,
        };
        let mut child = s(
            "c",
            vec![Step {
                fork: true,
                ..step(100)
            }],
        );
        child.fork_of = Some(ForkOf {
            session: 0,
            step: 0,
            after_gap: true,
        });
        Workload {
            name: "t".into(),
            hash_block: 16,
            looping: Loop::Closed,
            sessions: vec![
                s("a", vec![step(1000), step(1100)]),
                s("b", vec![step(500)]),
                child,
            ],
        }
    }

    fn req(session: &str, fork: bool) -> RouteRequest<'_> {
        let input = StepInput {
            model: "",
            prompt_tokens: 100,
            block_size: 16,
            session: Some(session),
            now_ms: 0,
            samples: 0,
            fork,
        };
        step::route_request(input, Owned::default(), Needs::ALL)
    }

    #[test]
    fn sessions_spread_by_lifetime_kv_and_follow_their_cache() {
        let mut o = Oracle::new(&workload());
        let idle = [
            WorkerView::idle(WorkerId(0), Role::Decode),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let a = o.choose(&req("a", false), &idle).expect("placed").worker;
        let b = o.choose(&req("b", false), &idle).expect("placed").worker;
        assert_ne!(a, b, "the second session goes where less KV is committed");
        // a's worker caches its prompt: its next step and its fork stay there.
        let cached = idle.map(|w| WorkerView {
            cached_blocks: if w.id == a { 6 } else { 0 },
            host_cached_blocks: 0,
            pulls_kv: true,
            prefill_decodes: true,
            ..w
        });
        assert_eq!(
            o.choose(&req("a", false), &cached).expect("placed").worker,
            a
        );
        let c = o.choose(&req("a", true), &cached).expect("placed");
        assert_eq!((c.worker, c.dispatch), (a, Dispatch::Single));
        // Queued prefill work elsewhere outweighs nothing here.
        let busy = cached.map(|w| WorkerView {
            active_prefill_tokens: if w.id == a { 10_000 } else { 0 },
            ..w
        });
        assert_eq!(o.choose(&req("b", false), &busy).expect("placed").worker, b);
    }
}
