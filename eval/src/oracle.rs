//! The oracle: a clairvoyant placement policy for the simulator. It knows every session's
//! future (how many steps, the largest context it will reach, its forks), so it can place
//! each new session once, balancing the KV memory sessions will hold over their lifetime,
//! and then keep every later step where its KV already is: nothing is copied, migrated or
//! recomputed because of a bad early choice. Long first prefills go to a prefill worker
//! when the fleet has one and its queue is empty (the simulator's load is exact). It is a heuristic with perfect knowledge, not a proven optimum:
//! it bounds what placement alone can buy, which is what the baselines differ in.

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

    /// The decode-capable worker with the least committed lifetime KV.
    fn emptiest<'a>(&self, workers: &'a [WorkerView]) -> Option<&'a WorkerView> {
        let full = workers
            .iter()
            .filter(|w| w.takes_work() && w.role.serves_full_requests());
        full.min_by_key(|w| (self.load(w.id), w.active_prefill_tokens, w.id.0))
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
        let (session, parent) = if req.fork {
            let child = self
                .children
                .get_mut(&name)
                .and_then(VecDeque::pop_front)
                .unwrap_or_else(|| name.clone());
            (child, Some(name))
        } else {
            (name, None)
        };
        let home = self
            .placed
            .get(&session)
            .map(|p| p.0)
            .filter(|w| workers.iter().any(|v| v.id == *w && v.takes_work()));
        let decision = match home {
            Some(w) => Decision::single(w),
            None => {
                let parent_home = parent
                    .as_ref()
                    .and_then(|p| self.placed.get(p))
                    .map(|p| p.0);
                let target = self.emptiest(workers).ok_or(PolicyError::NoHealthyWorker)?;
                match parent_home {
                    // A fork stays with its parent unless the parent's worker is fuller.
                    Some(p) if self.load(p) <= self.load(target.id) + target_slack(req) => {
                        Decision::single(p)
                    }
                    Some(p) => Decision {
                        worker: target.id,
                        dispatch: Dispatch::Fetch {
                            source: p,
                            tokens: u64::from(req.prompt_tokens),
                        },
                        plan: None,
                    },
                    None => self.first_step(req, workers, target.id),
                }
            }
        };
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
    /// A session's first step: long prompts are prefilled remotely if the fleet can.
    fn first_step(&self, req: &RouteRequest<'_>, workers: &[WorkerView], d: WorkerId) -> Decision {
        let cached = workers.iter().find(|w| w.id == d).map_or(0, |w| {
            u64::from(w.cached_blocks) * u64::from(req.block_size)
        });
        let fresh = u64::from(req.prompt_tokens).saturating_sub(cached);
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

/// How much more a fork's parent worker may hold than the emptiest before the fork moves.
fn target_slack(req: &RouteRequest<'_>) -> u64 {
    u64::from(req.prompt_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{ForkOf, Loop, Session, Step, Workload};

    fn step(input: u32) -> Step {
        Step {
            turn: 0,
            parent: None,
            input_tokens: input,
            output_tokens: 10,
            hash_ids: vec![0; input.div_ceil(16) as usize],
            arrival_ms: None,
            gap_after_ms: 0.0,
            samples: 1,
            fork: false,
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

    fn req<'a>(session: &'a str, fork: bool) -> RouteRequest<'a> {
        RouteRequest {
            prompt_tokens: 100,
            block_size: 16,
            session: Some(session),
            fork,
            ..Default::default()
        }
    }

    #[test]
    fn sessions_spread_by_lifetime_kv_then_stay_put() {
        let mut o = Oracle::new(&workload());
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Decode),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let a = o.choose(&req("a", false), &ws).expect("placed").worker;
        let b = o.choose(&req("b", false), &ws).expect("placed").worker;
        assert_ne!(a, b, "the second session goes to the emptier worker");
        assert_eq!(o.choose(&req("a", false), &ws).expect("placed").worker, a);
        // The fork of `a` stays with `a`: b's worker is no emptier by more than the prompt.
        let c = o.choose(&req("a", true), &ws).expect("placed");
        assert_eq!(c.worker, a);
        assert_eq!(c.dispatch, Dispatch::Single);
    }
}
