//! What the router decides and moves, counted on the request path: plans executed by
//! action (every policy), the cost planner's decisions by action and step class with
//! each cost term summed, fallbacks, where a known session's step ran against its
//! directory owner, KV bytes moved by kind, migrations and the migration budget spent,
//! demotions and closed sessions ended, what the retention sweep forgot, the prompts kept for sessions' next steps, queue
//! time and time to first token.

use std::time::Duration;

use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, Registry};

use ownerserve_planner::plan::{Action, Plan, StepClass};

use ownerserve_edge::exposition::{
    counter, counter_vec, float_counter_vec, gauge, histogram_vec, LATENCY_BUCKETS,
};

/// What the retention sweep forgets, as `ownerserve_directory_forgotten_total`'s `kind`.
pub const FORGOTTEN_KINDS: [&str; 2] = ["artifact", "session"];

/// The cost terms of a plan, each in (weighted) seconds so they add up to its total.
pub const COST_TERMS: [&str; 7] = [
    "queue",
    "compute",
    "network",
    "restore",
    "hbm",
    "interference",
    "decode",
];

/// Where a step of a session ran, against the directory's decode owner (for a demoted
/// session, the owner of its sealed prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the owner (an owner hit).
    Owner,
    /// Elsewhere (a move, a fork off the owner, or a fallback).
    Elsewhere,
    /// The directory knew no owner for the session yet (its first step).
    Unowned,
}

impl Placement {
    const ALL: [Placement; 3] = [Placement::Owner, Placement::Elsewhere, Placement::Unowned];

    fn name(self) -> &'static str {
        match self {
            Placement::Owner => "owner",
            Placement::Elsewhere => "elsewhere",
            Placement::Unowned => "unowned",
        }
    }
}

/// Kinds of KV movement between workers.
pub const KV_MOVES: [&str; 3] = ["remote_prefill", "artifact_fetch", "migrate"];

/// The router's decision and movement metrics.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    session_steps: IntCounterVec,
    kv_moved: IntCounterVec,
    migrations: IntCounter,
    /// Share of the cost planner's migration budget spent at its last decision.
    migration_budget_spent: Gauge,
    demotions: IntCounter,
    /// Sessions their clients closed, ended in the directory.
    sessions_ended: IntCounter,
    /// What the retention sweep removed from the directory, by kind (`artifact`,
    /// `session`).
    forgotten: IntCounterVec,
    /// Bytes of the prompts kept for sessions' next steps (`prompt::cache`), set at scrape.
    prompt_cache_bytes: Gauge,
    /// Routed requests whose ownership records were dropped: the directory sync was
    /// 4,096 records behind (`ownership_sync::MAX_QUEUED`; a directory outage), or their
    /// batch was refused whole.
    pub ownership_records_dropped: IntCounter,
    /// Requests shed by admission control, by reason.
    shed: IntCounterVec,
    /// New sessions' owner claims, by result.
    claims: IntCounterVec,
    /// Moves off an owner whose first answer was held for the read lease.
    moves_settled: IntCounter,
    /// Parked sessions' KV lifecycle.
    pub lifecycle: super::lifecycle::LifecycleMetrics,
    /// Admission by class and tenant.
    pub admission: super::admission::AdmissionMetrics,
    /// Each action's series (in `Action::ALL` order), looked up once: a labelled lookup
    /// hashes its values under a lock, and a proxied step made ~10 of them (~1 µs).
    by_action: Vec<ActionSeries>,
}

/// One action's series of the families labelled by action.
#[derive(Debug, Clone)]
struct ActionSeries {
    plans: IntCounter,
    fallbacks: IntCounter,
    queue_time: Histogram,
    ttft: Histogram,
    /// By step class, in `StepClass::ALL` order.
    decisions: Vec<IntCounter>,
    /// By cost term, in `COST_TERMS` order.
    cost: Vec<prometheus::Counter>,
}

impl ProxyMetrics {
    /// Registers the metrics of a router running `policy`; every label set starts at zero.
    #[expect(
        clippy::too_many_lines,
        reason = "one registration per metric family, in exposition order"
    )]
    pub fn register(registry: &Registry, policy: &str) -> prometheus::Result<Self> {
        let plans = counter_vec(
            registry,
            "ownerserve_plans_total",
            "Plans executed, by policy and action (baselines map to the action they amount to).",
            &["policy", "action"],
        )?;
        let fallbacks = counter_vec(
            registry,
            "ownerserve_plan_fallbacks_total",
            "Plans whose KV transfer leg failed and were recomputed on the decode worker.",
            &["policy", "action"],
        )?;
        let decisions = counter_vec(
            registry,
            "ownerserve_planner_decisions_total",
            "Cost-planner decisions, by chosen action and step class.",
            &["action", "class"],
        )?;
        let cost = float_counter_vec(
            registry,
            "ownerserve_planner_cost_seconds_total",
            "Sum of the chosen plans' cost terms in seconds (hbm and interference weighted by lambda and mu), by action and term.",
            &["action", "term"],
        )?;
        let session_steps = counter_vec(
            registry,
            "ownerserve_session_steps_total",
            "Routed steps of sessions, by where they ran against the directory's decode owner, or a demoted session's sealed-prefix owner (owner, elsewhere, unowned).",
            &["placement"],
        )?;
        let kv_moved = counter_vec(
            registry,
            "ownerserve_kv_moved_bytes_total",
            "KV bytes moved between workers, as the receiving workers reported, by kind.",
            &["kind"],
        )?;
        let migrations = counter(
            registry,
            "ownerserve_migrations_total",
            "Sessions whose ownership moved after their KV was copied to the target.",
        )?;
        let migration_budget_spent = gauge(
            registry,
            "ownerserve_planner_migration_budget_spent",
            "Share of the cost planner's migration budget spent at its last decision, 0 to 1 (0 without a budget): the KV its migrations shipped over planner_migration_budget of the KV of the prompts it routed. Past 0.5 each move pays a rising price; at 1 only hand-overs off draining workers move.",
        )?;
        let demotions = counter(
            registry,
            "ownerserve_session_demotions_total",
            "Idle sessions demoted when their lease lapsed.",
        )?;
        let sessions_ended = counter(
            registry,
            "ownerserve_sessions_ended_total",
            "Sessions their clients closed (x-ownerserve-session-control: close), ended in the directory.",
        )?;
        let forgotten = counter_vec(
            registry,
            "ownerserve_directory_forgotten_total",
            "What this router's retention sweep removed from the directory: prefix artifacts no session used for directory.artifact_retention_s (kind=artifact), demoted sessions idle for directory.session_retention_s (kind=session).",
            &["kind"],
        )?;
        for kind in FORGOTTEN_KINDS {
            forgotten.with_label_values(&[kind]);
        }
        let prompt_cache_bytes = gauge(
            registry,
            "ownerserve_prompt_cache_bytes",
            "Bytes of the prompts the router keeps so a session's next step tokenizes only what it adds (within prompt_cache_mb; a closed session's go at once).",
        )?;
        let shed = counter_vec(
            registry,
            "ownerserve_admission_shed_total",
            "Requests shed: the model's queue was full (429), no slot freed within the class's queue deadline (503), or the API key was over its rate limit (429).",
            &["reason"],
        )?;
        let claims = counter_vec(
            registry,
            "ownerserve_ownership_claims_total",
            "Owner claims committed before a session's first step (or a step of a session without a live owner): won, lost to another router (the step went to the winner), or failed (no answer within ownership_claim_timeout_ms; the step went where planned).",
            &["result"],
        )?;
        let moves_settled = counter(
            registry,
            "ownerserve_ownership_moves_settled_total",
            "Moves of a session off an owner (a claim or a migration's flip) whose first step's answer was held until the read lease (read_lease_ms) had passed since the move's commit, so no router sends the session's next step to the owner it left.",
        )?;
        let ownership_records_dropped = counter(
            registry,
            "ownerserve_ownership_records_dropped_total",
            "Routed requests whose ownership records were dropped: the directory sync was too far behind (a directory outage), or the directory refused their batch whole. A batch it did not answer is tried again, not dropped.",
        )?;
        let queue_time = histogram_vec(
            registry,
            "ownerserve_request_queue_time_seconds",
            "Time from a request's arrival until its decode leg is sent: planning, directory lookup and any prefill, pull or migration leg.",
            &["action"],
            LATENCY_BUCKETS,
        )?;
        let ttft = histogram_vec(
            registry,
            "ownerserve_time_to_first_token_seconds",
            "Time from a request's arrival until the first byte of the decode worker's response reached the router.",
            &["action"],
            LATENCY_BUCKETS,
        )?;
        let by_action = Action::ALL
            .iter()
            .map(|a| {
                let action = a.name();
                ActionSeries {
                    plans: plans.with_label_values(&[policy, action]),
                    fallbacks: fallbacks.with_label_values(&[policy, action]),
                    queue_time: queue_time.with_label_values(&[action]),
                    ttft: ttft.with_label_values(&[action]),
                    decisions: StepClass::ALL
                        .iter()
                        .map(|c| decisions.with_label_values(&[action, c.name()]))
                        .collect(),
                    cost: COST_TERMS
                        .iter()
                        .map(|term| cost.with_label_values(&[action, term]))
                        .collect(),
                }
            })
            .collect();
        for p in Placement::ALL {
            session_steps.with_label_values(&[p.name()]);
        }
        for kind in KV_MOVES {
            kv_moved.with_label_values(&[kind]);
        }
        Ok(Self {
            session_steps,
            kv_moved,
            migrations,
            migration_budget_spent,
            demotions,
            sessions_ended,
            forgotten,
            prompt_cache_bytes,
            shed,
            claims,
            moves_settled,
            ownership_records_dropped,
            lifecycle: super::lifecycle::LifecycleMetrics::register(registry)?,
            admission: super::admission::AdmissionMetrics::register(registry)?,
            by_action,
        })
    }

    /// Counts a session owner claim by its result.
    pub fn claim(&self, result: &str) {
        self.claims.with_label_values(&[result]).inc();
    }

    /// Counts a move whose first answer is held for the read lease.
    pub fn move_settled(&self) {
        self.moves_settled.inc();
    }

    /// Counts a request shed by admission control or its key's rate limit.
    pub fn shed(&self, reason: &str) {
        self.shed.with_label_values(&[reason]).inc();
    }

    /// `a`'s series (every action has them: registered for `Action::ALL`).
    fn of(&self, a: Action) -> &ActionSeries {
        let i = Action::ALL.iter().position(|x| *x == a).unwrap_or(0);
        &self.by_action[i]
    }

    /// A plan was executed.
    pub fn plan(&self, a: Action) {
        self.of(a).plans.inc();
    }

    /// A plan's transfer leg failed and the decode worker recomputed instead.
    pub fn fallback(&self, a: Action) {
        self.of(a).fallbacks.inc();
    }

    /// The cost planner chose `plan`.
    pub fn decided(&self, plan: &Plan, weights: ownerserve_planner::plan::Weights) {
        let series = self.of(plan.chosen.action);
        let class = StepClass::ALL
            .iter()
            .position(|c| *c == plan.class)
            .unwrap_or(0);
        series.decisions[class].inc();
        self.migration_budget_spent.set(plan.migration_budget_spent);
        let c = &plan.chosen.cost;
        let terms = [
            c.queue_s,
            c.compute_s,
            c.network_s,
            c.restore_s,
            weights.lambda_s_per_gb * c.hbm_bytes / 1e9,
            weights.mu * c.interference_s,
            weights.rho * c.decode_s,
        ];
        for (counter, v) in series.cost.iter().zip(terms) {
            if v.is_finite() && v > 0.0 {
                counter.inc_by(v);
            }
        }
    }

    /// A step of a session ran, placed as `p` against its owner.
    pub fn session_step(&self, p: Placement) {
        self.session_steps.with_label_values(&[p.name()]).inc();
    }

    /// KV bytes the decode worker of a step executed as `a` reported receiving (a
    /// migration's copy is counted by [`ProxyMetrics::migrated`]).
    pub fn kv_received(&self, a: Action, bytes: u64) {
        let kind = match a {
            Action::RemotePrefill => "remote_prefill",
            Action::ArtifactFetch => "artifact_fetch",
            Action::Migrate | Action::TailRecompute | Action::Colocate => return,
        };
        if bytes > 0 {
            self.kv_moved.with_label_values(&[kind]).inc_by(bytes);
        }
    }

    /// A session's ownership moved after its KV was copied (`bytes`).
    pub fn migrated(&self, bytes: u64) {
        self.migrations.inc();
        if bytes > 0 {
            self.kv_moved.with_label_values(&["migrate"]).inc_by(bytes);
        }
    }

    /// An idle session's lease lapsed and it was demoted.
    pub fn demoted(&self) {
        self.demotions.inc();
    }

    /// A session its client closed was ended in the directory.
    pub fn session_ended(&self) {
        self.sessions_ended.inc();
    }

    /// The retention sweep removed `n` directory entries of `kind` (one of
    /// [`FORGOTTEN_KINDS`]).
    pub fn forgotten(&self, kind: &str, n: u64) {
        self.forgotten.with_label_values(&[kind]).inc_by(n);
    }

    /// The prompt cache holds `bytes` now.
    pub fn prompt_cache(&self, bytes: usize) {
        self.prompt_cache_bytes.set(bytes as f64);
    }

    /// The decode leg of a step executed as `a` goes out `after` its arrival.
    pub fn dispatched(&self, a: Action, after: Duration) {
        self.of(a).queue_time.observe(after.as_secs_f64());
    }

    /// The time-to-first-token histogram of steps executed as `a`.
    pub fn ttft(&self, a: Action) -> Histogram {
        self.of(a).ttft.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

    use super::*;

    #[test]
    fn counts_render_by_action_and_every_label_set_starts_at_zero() {
        let registry = Registry::new();
        let m = ProxyMetrics::register(&registry, "ownerserve").unwrap();
        m.plan(Action::Migrate);
        m.plan(Action::Migrate);
        m.fallback(Action::RemotePrefill);
        m.migrated(10);
        m.kv_received(Action::RemotePrefill, 7);
        m.session_step(Placement::Owner);
        let text = ownerserve_edge::exposition::render(&registry);
        for line in [
            "ownerserve_plans_total{action=\"migrate\",policy=\"ownerserve\"} 2",
            "ownerserve_plans_total{action=\"colocate\",policy=\"ownerserve\"} 0",
            "ownerserve_plan_fallbacks_total{action=\"remote_prefill\",policy=\"ownerserve\"} 1",
            "ownerserve_kv_moved_bytes_total{kind=\"migrate\"} 10",
            "ownerserve_kv_moved_bytes_total{kind=\"remote_prefill\"} 7",
            "ownerserve_migrations_total 1",
            "ownerserve_planner_migration_budget_spent 0",
            "ownerserve_session_steps_total{placement=\"owner\"} 1",
            "ownerserve_session_steps_total{placement=\"elsewhere\"} 0",
            "ownerserve_planner_decisions_total{action=\"colocate\",class=\"cold_resume\"} 0",
            "ownerserve_planner_cost_seconds_total{action=\"migrate\",term=\"network\"} 0",
            "# TYPE ownerserve_session_demotions_total counter",
            "ownerserve_sessions_ended_total 0",
            "ownerserve_directory_forgotten_total{kind=\"artifact\"} 0",
            "ownerserve_directory_forgotten_total{kind=\"session\"} 0",
            "ownerserve_prompt_cache_bytes 0",
            "# TYPE ownerserve_time_to_first_token_seconds histogram",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
    }
}
