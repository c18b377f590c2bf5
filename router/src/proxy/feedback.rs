//! Feedback, the last stage of an attempt: it consumes the attempt's [`Outcome`] and records
//! what the executed step teaches the router. The dispatch legs' outcome goes to metrics
//! and the policy's calibration; the decode worker's answer to the plan metrics; the
//! prompt's block hashes (from the identity stage, never re-derived from the body) to the
//! approximate KV index, the session's idle tracking and the ownership records. What can be
//! learned only when the stream ends (the session's activity, the decode time for the
//! policy's decode lifetime) it hands to the relay as [`Learned`].

use std::sync::Arc;

use ownerserve_planner::plan::Action;
use ownerserve_planner::policy::{Decision, Dispatch};
use ownerserve_shim::engines::KV_RECEIVED_BYTES_HEADER;

use super::dispatch::{Prepared, Sent};
use super::identity::Identity;
use super::relay::Decoded;
use super::view::StepView;
use crate::fleet::registry::Worker;
use crate::ops::metrics::proxy::Placement;
use crate::ownership::ownership_sync::{Effects, Routed};
use crate::ownership::session_life::StepKv;
use crate::ownership::sessions::{self, Activity};
use crate::server::state::AppState;
use ownerserve_ownership::node::Lookup;

/// What one attempt of a step did.
pub struct Outcome<'a> {
    pub decision: &'a Decision,
    pub view: &'a StepView<'a>,
    pub id: &'a Identity<'a>,
    /// The decode worker.
    pub worker: &'a Arc<Worker>,
    /// The legs run before the decode request.
    pub prepared: &'a Prepared,
    /// The decode worker's answer; `None` when it could not be reached.
    pub sent: Option<&'a Sent>,
}

/// What feedback leaves to the relay, for when the stream ends.
pub struct Learned {
    /// The session's activity, held until the response ends.
    pub activity: Option<Activity>,
    /// Where the relay reports the stream's decode time.
    pub decoded: Option<Decoded>,
}

/// Records `outcome`: the legs always; the step itself when the decode worker accepted it
/// (otherwise nothing is left for the relay).
pub fn learn(st: &AppState, outcome: &Outcome<'_>) -> Learned {
    let action = outcome.decision.action();
    legs_ran(st, action, outcome.prepared);
    let Some(sent) = outcome.sent else {
        return Learned {
            activity: None,
            decoded: None,
        };
    };
    if sent.pair_failed {
        st.metrics.fallback(action);
    }
    Learned {
        activity: accepted(st, outcome, &sent.response),
        decoded: decode_observer(st, outcome.worker),
    }
}

/// Counts what the legs before the decode request did: a fallback, a migration's bytes,
/// and a timed prefill leg for the policy's calibration.
fn legs_ran(st: &AppState, action: Action, prepared: &Prepared) {
    if prepared.fell_back {
        st.metrics.fallback(action);
    }
    if let Some(bytes) = prepared.migrated_bytes {
        st.metrics.migrated(bytes);
    }
    if let Some(t) = prepared.prefill.filter(|_| st.cfg.planner_calibrate) {
        let observed = t.observed_s * st.cfg.planner_time_scale;
        st.policy.observe_prefill(t.worker, t.predicted_s, observed);
    }
}

/// Where the relay reports how long `worker` decoded the step's stream, for the policy's
/// admission model (`Policy::observe_decode`), scaled to the planner's time like an
/// observed prefill; `None` when the router does not calibrate.
pub fn decode_observer(st: &AppState, worker: &Worker) -> Option<Decoded> {
    st.cfg.planner_calibrate.then(|| {
        st.policy
            .decode_observer(worker.id, st.cfg.planner_time_scale)
    })
}

/// Records a step the decode worker accepted: its metrics, where its prompt now is, the
/// session's activity (returned, to be held until the response ends) and the directory
/// records of its ownership.
fn accepted(
    st: &AppState,
    outcome: &Outcome<'_>,
    response: &hyper::Response<crate::upstream::pool::Pooled>,
) -> Option<Activity> {
    let Outcome {
        decision,
        view,
        id,
        worker,
        prepared,
        ..
    } = *outcome;
    observe(st, decision, view, id.session, response, prepared);
    // Only what the policy itself hashed feeds the index and the idle tail (a policy
    // that reads neither hashes the prompt only for the ownership records).
    let needs = st.policy.needs();
    let hashes = if needs.prefix_match || needs.directory {
        id.hashes()
    } else {
        &[]
    };
    st.kv.record_routed(worker, hashes);
    let started = id.tracked().map(|s| {
        let step = StepKv {
            tokens: u64::from(id.prompt_tokens()),
            prompt: (st.cfg.sessions.lifecycle && id.exact_tokens).then(|| id.prompt.clone()),
            model: view.route.model.into(),
            control: id.control,
        };
        st.sessions.start(
            s,
            worker.id,
            tail_hashes(st, hashes),
            sessions::now_ms(),
            step,
        )
    });
    if let Some((hold, found)) = started.as_ref().and_then(|s| s.returned) {
        st.metrics.lifecycle.returned(hold, found);
    }
    let predicted_gap_ms = started.as_ref().and_then(|s| s.predicted_gap_ms);
    if let Some(sync) = &st.ownership {
        sync.record(Routed {
            worker: worker.id,
            session: id.session.map(str::to_owned),
            root: id.root.map(str::to_owned),
            parent: id.parent.map(str::to_owned),
            prompt: id.prompt.clone(),
            effects: effects(
                decision,
                &view.lookup,
                prepared,
                id.child.clone(),
                predicted_gap_ms,
            ),
        });
    }
    started.map(|s| s.activity)
}

/// Counts an executed step: its plan and the planner's decision, where a session's step
/// ran against its owner, and the KV its decode worker reports receiving.
fn observe(
    st: &AppState,
    decision: &Decision,
    view: &StepView<'_>,
    session: Option<&str>,
    response: &hyper::Response<crate::upstream::pool::Pooled>,
    prepared: &Prepared,
) {
    let action = decision.action();
    st.metrics.plan(action);
    if let Some(plan) = &decision.plan {
        st.metrics.decided(plan, st.cfg.planner.weights);
    }
    if session.is_some() && st.policy.needs().directory {
        // A demoted session (known to the directory, its owner dropped after an idle lease)
        // is held by the owner of its sealed prefix: its resume belongs there.
        let lookup = &view.lookup;
        let home = lookup
            .owner
            .or_else(|| lookup.epoch.and(lookup.artifact.as_ref().map(|a| a.owner)));
        st.metrics.session_step(match home {
            Some(owner) if owner == decision.worker => Placement::Owner,
            Some(_) => Placement::Elsewhere,
            None => Placement::Unowned,
        });
    }
    let received = response
        .headers()
        .get(KV_RECEIVED_BYTES_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if !prepared.fell_back {
        st.metrics.kv_received(action, received);
    }
}

/// Block hashes of the prompt past its sealed prefix: what a demotion drops.
fn tail_hashes(st: &AppState, hashes: &[u64]) -> Vec<u64> {
    let block = st.kv.block_size() as u64;
    let tokens = hashes.len() as u64 * block;
    let sealed = st
        .cfg
        .planner
        .model
        .prefix_state(tokens, block as u32)
        .sealed_tokens;
    hashes[((sealed / block.max(1)) as usize).min(hashes.len())..].to_vec()
}

/// The directory effects of an executed decision.
fn effects(
    decision: &Decision,
    lookup: &Lookup,
    prepared: &Prepared,
    child: Option<String>,
    predicted_gap_ms: Option<u64>,
) -> Effects {
    let moved = lookup.owner != Some(decision.worker);
    let fetched = matches!(decision.dispatch, Dispatch::Fetch { .. }) && !prepared.fell_back;
    Effects {
        // The epoch the step ran under, or (run unrecorded after a claim that did not
        // commit) the one it was planned against: the record moves the session only if
        // nobody moved it since.
        expect_epoch: if moved {
            prepared.epoch.or(lookup.epoch)
        } else {
            None
        },
        replicate: fetched
            .then_some(lookup.artifact_key.map(|k| k.0))
            .flatten(),
        fork: child.zip(lookup.epoch),
        predicted_gap_ms,
    }
}

#[cfg(test)]
mod tests {
    use ownerserve_ownership::ids::{Epoch, PrefixKey};
    use ownerserve_planner::ids::WorkerId;

    use super::*;

    fn prepared(epoch: u64, fell_back: bool) -> Prepared {
        Prepared {
            body: bytes::Bytes::new(),
            headers: Vec::new(),
            epoch: Some(Epoch(epoch)),
            concurrent_prefill: None,
            fell_back,
            prefill: None,
            migrated_bytes: None,
            stale: false,
        }
    }

    fn decision(worker: u32, dispatch: Dispatch) -> Decision {
        Decision {
            worker: WorkerId(worker),
            dispatch,
            plan: None,
        }
    }

    #[test]
    fn a_step_that_moves_its_session_is_fenced_by_the_epoch_it_saw() {
        let lookup = Lookup {
            owner: Some(WorkerId(1)),
            epoch: Some(Epoch(5)),
            ..Lookup::default()
        };
        let stay = effects(
            &decision(1, Dispatch::Single),
            &lookup,
            &prepared(5, false),
            None,
            Some(3),
        );
        assert_eq!(
            stay,
            Effects {
                predicted_gap_ms: Some(3),
                ..Effects::default()
            }
        );
        let moved = effects(
            &decision(2, Dispatch::Single),
            &lookup,
            &prepared(5, false),
            None,
            None,
        );
        assert_eq!(moved.expect_epoch, Some(Epoch(5)));
        // Run unrecorded (its claim did not commit): the record still expects the epoch the
        // step was planned against.
        let unrecorded = Prepared {
            epoch: None,
            ..prepared(0, false)
        };
        let moved = effects(
            &decision(2, Dispatch::Single),
            &lookup,
            &unrecorded,
            None,
            None,
        );
        assert_eq!(moved.expect_epoch, Some(Epoch(5)));
        let fork = effects(
            &decision(1, Dispatch::Single),
            &lookup,
            &prepared(5, false),
            Some("kid".into()),
            None,
        );
        assert_eq!(fork.fork, Some(("kid".into(), Epoch(5))));
    }

    #[test]
    fn only_a_fetch_that_ran_registers_a_copy() {
        let lookup = Lookup {
            artifact_key: Some((PrefixKey(42), Epoch(2))),
            ..Lookup::default()
        };
        let fetch = Dispatch::Fetch {
            source: WorkerId(0),
            tokens: 32,
        };
        assert_eq!(
            effects(
                &decision(1, fetch),
                &lookup,
                &prepared(1, false),
                None,
                None
            )
            .replicate,
            Some(PrefixKey(42))
        );
        assert_eq!(
            effects(&decision(1, fetch), &lookup, &prepared(1, true), None, None).replicate,
            None
        );
        assert_eq!(
            effects(
                &decision(1, Dispatch::Single),
                &lookup,
                &prepared(1, false),
                None,
                None
            )
            .replicate,
            None
        );
    }
}
