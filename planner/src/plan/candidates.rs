//! Which candidates a step has, and what each costs.

use crate::ids::{Role, WorkerId};
use crate::roofline::{prefill_pairs, StepWork};

use super::{Action, Candidate, CostTerms, PlanInput, PlanWorker};

/// Every candidate `(action, workers)` for the step.
pub fn generate(input: &PlanInput<'_>) -> Vec<Candidate> {
    let p = Pricing { input };
    let owner = input
        .decode_owner
        .and_then(|d| input.workers.iter().find(|w| w.id == d));
    let artifact_owner = input
        .artifact
        .and_then(|a| input.workers.iter().find(|w| w.id == a.owner && w.healthy));
    // Where the session can decode: its owner while it takes work, else anywhere. A fork
    // is a new branch reading the shared prefix: it may start anywhere, and never moves
    // its parent.
    let fork = input.is_fork();
    let decoders: Vec<&PlanWorker> = match owner {
        Some(d) if d.takes_work() && !fork => vec![d],
        _ => input
            .workers
            .iter()
            .filter(|w| w.takes_work() && w.role.serves_full_requests())
            .collect(),
    };
    // Each prefill worker's share of a remote prefill, computed once for every decoder:
    // the work, and the bytes it computes (and keeps a copy of).
    let prompt_bytes = p.state_bytes(input.prompt_tokens);
    let prefillers: Vec<(&PlanWorker, Work, f64)> = input
        .workers
        .iter()
        .filter(|w| w.takes_work() && matches!(w.role, Role::Prefill | Role::Hybrid))
        .map(|w| {
            let work = p.work(w, p.to_compute(w.cached_tokens));
            let computed =
                prompt_bytes - p.state_bytes(input.prompt_tokens.saturating_sub(work.new));
            (w, work, computed)
        })
        .collect();
    let mut out = Vec::new();
    for d in &decoders {
        // Moving the session onto the artifact's owner is what tail_recompute prices.
        if input.decode_owner == Some(d.id) || artifact_owner.is_none_or(|o| o.id != d.id) {
            out.push(p.colocate(d));
        }
        // What d receives and duplicates does not depend on the prefill worker.
        let lacks = (prompt_bytes - p.state_bytes(d.cached_tokens)).max(0.0);
        let dup = p.duplicated(d, input.prompt_tokens);
        for (pre, work, computed) in prefillers.iter().filter(|(w, ..)| w.id != d.id) {
            out.push(p.candidate(
                Action::RemotePrefill,
                pre,
                d,
                Some(pre.id),
                *work,
                lacks,
                dup + computed,
            ));
        }
        if let Some(o) = artifact_owner {
            if o.id != d.id {
                out.extend(p.artifact_fetch(o, d));
            }
        }
    }
    if let Some(o) = artifact_owner {
        if o.takes_work() && o.role.serves_full_requests() && input.decode_owner != Some(o.id) {
            out.push(p.tail_recompute(o));
        }
    }
    if let Some(d) = owner.filter(|d| d.healthy && !fork) {
        for t in input
            .workers
            .iter()
            .filter(|t| t.id != d.id && t.takes_work() && t.role.serves_full_requests())
        {
            out.push(p.migrate(d, t));
        }
    }
    out
}

/// Tokens a candidate computes, and how long that takes where it runs.
#[derive(Debug, Clone, Copy)]
struct Work {
    /// Prompt tokens each sequence computes (the rest is reused).
    new: u64,
    /// Tokens computed in all.
    tokens: u64,
    compute_s: f64,
}

struct Pricing<'a, 'b> {
    input: &'a PlanInput<'b>,
}

impl Pricing<'_, '_> {
    fn prompt(&self) -> u64 {
        self.input.prompt_tokens
    }

    /// Bytes of the whole state of the first `tokens` prompt tokens.
    fn state_bytes(&self, tokens: u64) -> f64 {
        self.input
            .model
            .prefix_state(tokens, self.input.block_size)
            .total_bytes()
    }

    /// Bytes of the sealed artifacts covering tokens `from..to`.
    fn sealed_bytes(&self, from: u64, to: u64) -> f64 {
        let sealed = |t| {
            self.input
                .model
                .prefix_state(t, self.input.block_size)
                .sealed_bytes()
        };
        (sealed(to) - sealed(from)).max(0.0)
    }

    /// Tokens computed when `reused` leading tokens need no compute; at least one, as
    /// engines recompute the last prompt token to sample from it.
    fn to_compute(&self, reused: u64) -> u64 {
        self.prompt().saturating_sub(reused).max(1)
    }

    /// `new` tokens computed on `w` after the rest of the prompt, by each of the step's
    /// samples: `n` sequences admitted together each prefill what is not cached yet (as
    /// vLLM's parallel sampling does).
    fn work(&self, w: &PlanWorker, new: u64) -> Work {
        let n = u64::from(self.input.samples.max(1));
        Work {
            new,
            tokens: new * n,
            compute_s: self.prefill_s(w, new, n),
        }
    }

    fn prefill_s(&self, w: &PlanWorker, new: u64, n: u64) -> f64 {
        let context = self.prompt().saturating_sub(new);
        let work = StepWork {
            prefill_tokens: new * n,
            prefill_attention_pairs: prefill_pairs(new, context) * n,
            prefill_context_tokens: context * n,
            ..StepWork::default()
        };
        w.roofline.step_time(self.input.model, &work).total_s * w.prefill_scale
    }

    fn transfer_s(&self, from: WorkerId, to: &PlanWorker, bytes: f64) -> (f64, f64) {
        if bytes <= 0.0 {
            return (0.0, 0.0);
        }
        let link = self.input.links.get(from, to.id);
        (
            link.latency_s + bytes / link.bytes_per_s,
            bytes / to.roofline.bytes_per_s(),
        )
    }

    /// HBM duplicated when `w` ends up holding its own copy of the first `tokens` of a
    /// sealed artifact another worker owns.
    fn duplicated(&self, w: &PlanWorker, tokens: u64) -> f64 {
        match self.input.artifact {
            Some(a) if a.owner != w.id => {
                let held = a.tokens.min(self.prompt());
                self.sealed_bytes(w.cached_tokens.min(held), tokens.min(held))
            }
            _ => 0.0,
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call per action, each term named"
    )]
    fn candidate(
        &self,
        action: Action,
        compute_on: &PlanWorker,
        decode_on: &PlanWorker,
        source: Option<WorkerId>,
        work: Work,
        network_bytes: f64,
        hbm_bytes: f64,
    ) -> Candidate {
        let Work {
            new,
            tokens: compute_tokens,
            compute_s,
        } = work;
        let (network_s, restore_s) = match source {
            Some(s) => self.transfer_s(s, decode_on, network_bytes),
            None => (0.0, 0.0),
        };
        let cost = CostTerms::new(
            self.input.weights,
            compute_on.queue_s,
            compute_s,
            network_s,
            restore_s,
            hbm_bytes,
            compute_s * compute_on.decoding as f64,
        );
        Candidate {
            action,
            compute_on: compute_on.id,
            decode_on: decode_on.id,
            source,
            compute_tokens,
            reused_tokens: self.prompt().saturating_sub(new),
            network_bytes,
            cost,
        }
    }

    fn colocate(&self, d: &PlanWorker) -> Candidate {
        let new = self.to_compute(d.cached_tokens);
        let dup = self.duplicated(d, self.prompt());
        self.candidate(Action::Colocate, d, d, None, self.work(d, new), 0.0, dup)
    }

    fn artifact_fetch(&self, o: &PlanWorker, w: &PlanWorker) -> Option<Candidate> {
        let a = self.input.artifact?;
        let sealed = a.tokens.min(self.prompt());
        if sealed <= w.cached_tokens {
            return None;
        }
        let fetched = self.sealed_bytes(w.cached_tokens, sealed);
        let reused = self.input.model.resume_point(sealed).max(w.cached_tokens);
        let new = self.to_compute(reused);
        Some(self.candidate(
            Action::ArtifactFetch,
            w,
            w,
            Some(o.id),
            self.work(w, new),
            fetched,
            fetched,
        ))
    }

    fn tail_recompute(&self, o: &PlanWorker) -> Candidate {
        let sealed = self
            .input
            .artifact
            .map_or(0, |a| a.tokens.min(self.prompt()).min(o.cached_tokens));
        let new = self.to_compute(self.input.model.resume_point(sealed));
        self.candidate(
            Action::TailRecompute,
            o,
            o,
            None,
            self.work(o, new),
            0.0,
            0.0,
        )
    }

    fn migrate(&self, d: &PlanWorker, t: &PlanWorker) -> Candidate {
        let moved_tokens = d.cached_tokens.min(self.prompt());
        let moved = (self.state_bytes(moved_tokens)
            - self.state_bytes(t.cached_tokens.min(moved_tokens)))
        .max(0.0);
        let new = self.to_compute(moved_tokens.max(t.cached_tokens));
        // The source frees what it sends: nothing is duplicated.
        self.candidate(
            Action::Migrate,
            t,
            t,
            Some(d.id),
            self.work(t, new),
            moved,
            0.0,
        )
    }
}
