//! The proxy's request path, one stage per file, each handing the next what it computed:
//!
//! ```text
//! ingress   read the body within its limit, parse and validate it, check the model
//!    ↓
//! identity  sessions, then the prompt (tokens and block hashes, one HashedPrompt), which
//!    ↓      ingress refuses when over the model's context, then the fork child
//! view      the planner's input: directory lookup, KV-index matches, worker load
//!    ↓
//! plan      the routing policy's decision
//!    ↓
//! claim     a session without a live owner: its owner committed in the directory first
//!    ↓
//! dispatch  the engines' protocols: prefill legs, fetch, migration, the decode request
//!    ↓
//! feedback  the attempt's outcome: metrics, calibration, KV index, session activity,
//!    ↓      ownership records
//! relay     the worker's response streamed back (it reports the decode time and ends
//!           the session's activity, as feedback asked, when the stream ends)
//! ```
//!
//! Ingress and identity are the front half (`front::front_half`), shared with `explain`,
//! the endpoint picker and `count_tokens`; for a request it serves, a new session's first
//! step then waits for room in the fleet's KV (`session_admission`, when on). What an API surface serves beyond generation
//! lives in [`crate::api`].
//!
//! A worker that refuses the connection is marked down and the step is planned again
//! without it; any other failure is the client's error.

pub mod admission;
pub(crate) mod busy_poll;

pub mod claim;
pub mod dispatch;
pub mod feedback;
pub(crate) mod front;
pub mod identity;
pub mod ingress;
pub mod plan;
pub mod receipt;
pub mod relay;
pub mod session_admission;
pub mod tenant_budget;
pub mod view;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;

use ownerserve_planner::policy::{Decision, Dispatch, PrefillCharge};
use ownerserve_planner::step::Ledger;
use ownerserve_shim::openai::Endpoint;

use crate::api::responses;
use crate::error::ApiError;
use crate::fleet::registry::{InFlight, Worker};
use crate::proxy::admission::{Refusal, Ticket};
use crate::server::state::AppState;
use crate::upstream::ForwardError;
use ownerserve_edge::http_metrics::Executed;

/// Serves one client request to `endpoint`.
pub async fn handle(st: &AppState, req: Request, endpoint: Endpoint) -> Result<Response, ApiError> {
    let started = Instant::now();
    let _handling = st.busy_poll.handling();
    let ask = front::Ask {
        endpoint,
        hashing: st.hashing(),
        admits: true,
    };
    front::front_half(st, req, ask, async |f| {
        serve(st, f, endpoint, started).await
    })
    .await
}

/// Serves a request past its front half: view, plan, claim, dispatch, relay.
async fn serve(
    st: &AppState,
    f: front::Front<'_>,
    endpoint: Endpoint,
    started: Instant,
) -> Result<Response, ApiError> {
    let (req, parsed, id) = (f.req, f.parsed, f.id);
    let headers = &req.parts.headers;
    let needs = st.policy.needs();
    if needs.directory {
        claim::catch_up(st, false).await;
    }
    let mut view = st
        .sources()
        .step(&parsed.model, id, parsed.sampling.n, needs);
    // A Responses follow-up goes where its previous response is stored.
    let pinned = responses::owner_of_previous(st, parsed).await?;
    let mut replans = 0;
    let mut failed = Vec::new();
    loop {
        let candidates = st
            .sources()
            .candidates(&parsed.model, id.hashes(), &failed, needs);
        let planned = Planned {
            view: &view,
            candidates: &candidates,
            failed: &failed,
            dispatches: true,
        };
        let (decision, lookup, fork_fence, settle_until) =
            planned.decide(st, id, pinned, endpoint).await?;
        let step = dispatch::Step {
            path: endpoint.path(),
            body: &req.body,
            session: id.session,
            fork_fence,
            lookup: &lookup,
            hashes: id.hashes(),
            block: u64::from(view.route.block_size),
            prompt_tokens: u64::from(view.route.prompt_tokens),
            request_id: req.request_id.clone(),
            authorization: st.cfg.engine_authorization.clone(),
            priority: f.class.engine_rank(
                st.cfg.sessions.return_priority
                    && id.session.is_some_and(|s| st.sessions.is_returning(s)),
            ),
        };
        let (worker, cached) = serving(st, &decision, &candidates, &parsed.model)?;
        let attempt = Attempt {
            st,
            step: &step,
            id,
            view: &view,
            client_headers: headers,
            started,
            stores_response: parsed.store,
            continues_stored: parsed.previous_response_id.is_some(),
            endpoint,
            settle_until,
        };
        match attempt.run(&decision, &worker, cached).await {
            // The slot is held until the response body ends.
            Ok(response) => return Ok(response.map(|b| holding(b, f.ticket))),
            // Nothing reached the worker: mark it down and try the next one (unless it
            // holds the previous response: that cannot run elsewhere).
            Err(ForwardError::Connect) => {
                worker.mark_down("connection refused");
                if pinned.is_some() {
                    return Err(responses::owner_down(parsed, &worker.spec.name));
                }
                failed.push(worker.id);
            }
            // The session moved under another router: read the directory again, then plan.
            Err(ForwardError::StaleView) if replans < MAX_REPLANS => {
                replans += 1;
                claim::catch_up(st, true).await;
                view = st
                    .sources()
                    .step(&parsed.model, id, parsed.sampling.n, needs);
            }
            Err(e) => {
                tracing::warn!(worker = %worker.spec.name, error = %e, "forward failed");
                // Passive health: a timeout or a connection that failed mid-request counts
                // as a failed check (a refused one, above, marks the worker down at once).
                if matches!(e, ForwardError::Timeout(_) | ForwardError::Failed) {
                    worker.record_failure(st.cfg.health_failure_threshold, &e.to_string());
                }
                return Err(e.into_api(&worker));
            }
        }
    }
}

/// What a step's decision is made from (the proxy's and the endpoint picker's).
pub(crate) struct Planned<'a> {
    pub view: &'a view::StepView<'a>,
    pub candidates: &'a [ownerserve_planner::policy::WorkerView],
    pub failed: &'a [ownerserve_planner::ids::WorkerId],
    /// Whether this process dispatches the step (the proxy), so a migration's owner flip
    /// commits after its KV copy; the endpoint picker only answers where the gateway sends
    /// the request, so a migration there is claimed before the answer like any move.
    pub dispatches: bool,
}

impl Planned<'_> {
    /// The policy's decision, its owner claim settled, and the lookup it runs under; a
    /// step `pinned` to a worker (its previous response's owner) runs there whole. An
    /// endpoint without prefill/decode legs (the agents' APIs: no engine defines them)
    /// runs whole on its decode worker, counted as a fallback.
    pub(crate) async fn decide<'i>(
        &self,
        st: &AppState,
        id: &'i identity::Identity<'_>,
        pinned: Option<ownerserve_planner::ids::WorkerId>,
        endpoint: Endpoint,
    ) -> Result<Decided<'i>, ApiError> {
        let view = self.view;
        let (mut decision, lookup, fork_fence, settle_until) = match pinned {
            Some(owner) => (Decision::single(owner), view.lookup, None, None),
            None => {
                let decision = st.policy.choose(&view.route, self.candidates)?;
                let (settled, claimed, settle_until) =
                    claim::settle(st, id, &view.lookup, &decision, self.dispatches).await;
                let fork_fence = claim::fork_fence(id, settled);
                let (decision, lookup) =
                    claim::route(st, (settled, claimed), &view.lookup, decision, self.failed);
                (decision, lookup, fork_fence, settle_until)
            }
        };
        // The gateway sends the request as soon as the pick is answered: a move waits here.
        let settle_until = match (settle_until, self.dispatches) {
            (Some(t), false) => {
                tokio::time::sleep_until(t).await;
                None
            }
            (t, _) => t,
        };
        if !crate::api::endpoints::of(endpoint).disaggregable
            && matches!(decision.dispatch, Dispatch::Disaggregated { .. })
        {
            st.metrics.fallback(decision.action());
            decision.dispatch = Dispatch::Single;
        }
        Ok((decision, lookup, fork_fence, settle_until))
    }
}

/// A step's decision, the lookup it is dispatched under, a fork's committed child to
/// fence it as, and when a move's answer may reach the client (`claim::settle_move`).
pub(crate) type Decided<'i> = (
    Decision,
    ownerserve_ownership::node::Lookup,
    Option<(&'i str, ownerserve_ownership::ids::Epoch)>,
    Option<tokio::time::Instant>,
);

/// The decision's worker and the blocks of the prompt it caches, or no healthy worker.
fn serving(
    st: &AppState,
    decision: &Decision,
    candidates: &[ownerserve_planner::policy::WorkerView],
    model: &str,
) -> Result<(Arc<Worker>, u64), ApiError> {
    let Some(worker) = st.registry.get(decision.worker) else {
        return Err(ApiError::NoHealthyWorker {
            model: model.to_string(),
        });
    };
    let cached = candidates
        .iter()
        .find(|c| c.id == worker.id)
        .map_or(0, |c| c.cached_blocks);
    Ok((worker, u64::from(cached)))
}

/// Times a step is planned again because its session moved under another router.
const MAX_REPLANS: u32 = 2;

/// A slot for a request of `model`, or the 429 (queue full) or 503 (its class's deadline
/// passed) that sheds it, counted by reason and class.
pub(crate) async fn admit(
    st: &AppState,
    model: &str,
    asked: admission::Asked,
) -> Result<Ticket, ApiError> {
    let healthy = st.registry.healthy_serving(model);
    let since = tokio::time::Instant::now();
    let admitted = st.admission.admit(model, healthy, asked).await;
    let class = asked.class;
    match admitted {
        Ok(ticket) => {
            st.metrics.admission.admitted(class, since.elapsed());
            Ok(ticket)
        }
        Err(r) => {
            st.metrics.shed(r.reason());
            st.metrics.admission.refused(class, r.reason());
            let retry_after_s = r.retry_after_s();
            Err(match r {
                Refusal::QueueFull { .. } => ApiError::Overloaded {
                    model: model.to_owned(),
                    why: "its queue is full",
                    retry_after_s,
                },
                Refusal::TimedOut { .. } => ApiError::QueueTimeout {
                    model: model.to_owned(),
                    class: class.name(),
                    retry_after_s,
                },
            })
        }
    }
}

/// `body`, holding `ticket` until it is dropped (the body ended or the client left).
fn holding(body: Body, ticket: Option<Ticket>) -> Body {
    Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
        let _held = &ticket;
        frame
    }))
}

/// One try of a step on the decision's worker: dispatch, then relay and feedback.
struct Attempt<'a> {
    st: &'a AppState,
    step: &'a dispatch::Step<'a>,
    id: &'a identity::Identity<'a>,
    view: &'a view::StepView<'a>,
    client_headers: &'a HeaderMap,
    started: Instant,
    /// A stored Responses answer: its owner is recorded as it is relayed.
    stores_response: bool,
    /// A Responses follow-up: the engine runs its stored conversation before this input,
    /// a prompt the router never saw, so the cache the engine reports is not held to the
    /// router's promise (its receipt is unchecked).
    continues_stored: bool,
    /// The API whose error event ends a stream that fails.
    endpoint: Endpoint,
    /// The step moved its session off an owner: its answer waits until then
    /// (`claim::settle_move`).
    settle_until: Option<tokio::time::Instant>,
}

impl Attempt<'_> {
    /// Runs the legs, with the request counted against the decode `worker` from
    /// dispatch, as the simulator counts it: the steps planned while the legs run see
    /// the KV it will take there and, for a remote prefill, its decode leg heading for
    /// that worker's queue.
    async fn prepare(
        &self,
        decision: &Decision,
        worker: &Arc<Worker>,
        cached_blocks: u64,
    ) -> (InFlight, dispatch::Prepared) {
        let prompt = u64::from(self.view.route.prompt_tokens);
        let cached = cached_blocks * self.step.block;
        let charged = worker.ledger().start_request(
            decision,
            self.view.route.prompt_blocks(),
            prompt,
            cached,
        );
        let mut in_flight = worker.hold(charged, prompt);
        // A remote prefill's leg and a move's copy run before the request reaches the
        // worker's queue; until then it is heading there.
        if Ledger::heads_first(decision.dispatch) {
            in_flight.leg_heading();
        }
        let prepared = self
            .st
            .dispatcher()
            .prepare(self.step, decision, worker)
            .await;
        in_flight.leg_arrived();
        // A fetch or move that fell back leaves the worker to compute what it lacks.
        if prepared.fell_back {
            in_flight.recharge(PrefillCharge::computed(prompt.saturating_sub(cached)));
        }
        (in_flight, prepared)
    }

    /// The step's route receipt, to be checked against the engine's answer.
    fn receipt(
        &self,
        decision: &Decision,
        worker: &Arc<Worker>,
        cached_blocks: u64,
        prepared: &dispatch::Prepared,
    ) -> receipt::Check {
        let block = self.step.block;
        let prompt = u64::from(self.view.route.prompt_tokens);
        let receipt = receipt::Receipt {
            action: decision.action().name(),
            predicted_cached: receipt::Receipt::promise(prompt, cached_blocks, block),
            epoch: prepared.epoch.map(|e| e.0),
            index: self.st.kv.mode_of(worker),
            checkable: matches!(decision.dispatch, Dispatch::Single)
                && !prepared.fell_back
                && !self.continues_stored,
            block,
            priority: self.step.priority,
        };
        receipt::Check::new(
            receipt,
            worker.clone(),
            receipt::wanted_in_usage(self.client_headers),
        )
    }

    /// When the answer may reach the client: a claimed move's moment, or, when a migration
    /// flipped its session to a new epoch, the read lease from now (`claim::settle_move`).
    fn settle_until(
        &self,
        decision: &Decision,
        prepared: &dispatch::Prepared,
    ) -> Option<tokio::time::Instant> {
        let migrated = matches!(decision.dispatch, Dispatch::Migrate { .. })
            && prepared.epoch.is_some()
            && prepared.epoch != self.step.lookup.epoch;
        match migrated {
            true => claim::settle_move(self.st),
            false => self.settle_until,
        }
    }

    /// Runs the legs and sends the decode request, then feedback (the last stage) consumes
    /// the attempt's outcome and the relay streams the answer; `cached_blocks` of the
    /// prompt are already on `worker`.
    async fn run(
        &self,
        decision: &Decision,
        worker: &Arc<Worker>,
        cached_blocks: u64,
    ) -> Result<Response, ForwardError> {
        let (st, view) = (self.st, self.view);
        let action = decision.action();
        let (in_flight, prepared) = self.prepare(decision, worker, cached_blocks).await;
        if prepared.stale {
            return Err(ForwardError::StaleView);
        }
        let settle_until = self.settle_until(decision, &prepared);
        st.metrics.dispatched(action, self.started.elapsed());
        let sent = dispatch::send(
            &st.upstream,
            worker,
            self.step.path,
            self.client_headers,
            &prepared,
        )
        .await;
        let learned = feedback::learn(
            st,
            &feedback::Outcome {
                decision,
                view,
                id: self.id,
                worker,
                prepared: &prepared,
                sent: sent.as_ref().ok(),
            },
        );
        let sent = sent?;
        // The engine works on the step meanwhile; the client sees nothing before then, so
        // the session's next step cannot reach a router still reading the move as unmade.
        if let Some(t) = settle_until {
            tokio::time::sleep_until(t).await;
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let reason = decision
                .plan
                .as_ref()
                .map(|p| p.reason())
                .unwrap_or_default();
            let reason = st.registry.name_workers(&reason);
            tracing::debug!(action = action.name(), worker = %worker.spec.name, fell_back = prepared.fell_back, reason, "plan executed");
        }
        let first_byte = relay::FirstByte {
            histogram: st.metrics.ttft(action),
            started: self.started,
            decoded: learned.decoded,
        };
        let patience = relay::Patience {
            first: st.cfg.request_timeout,
            idle: st.cfg.stream_idle_timeout,
            failure_threshold: st.cfg.health_failure_threshold,
        };
        let watchers = relay::Watchers {
            activity: learned.activity,
            first_byte: Some(first_byte),
            check: Some(self.receipt(decision, worker, cached_blocks, &prepared)),
        };
        let mut relayed = relay::relay(
            sent.response,
            worker,
            in_flight,
            watchers,
            patience,
            self.endpoint,
        );
        relayed.extensions_mut().insert(Executed(action.name()));
        if self.stores_response {
            relayed = responses::record_owner(st, worker.id, relayed);
        }
        // The ownership epoch the step ran under, for clients that check fencing.
        if let Some(epoch) = prepared.epoch {
            relayed.headers_mut().insert(
                crate::api::headers::EPOCH,
                axum::http::HeaderValue::from(epoch.0),
            );
        }
        Ok(relayed)
    }
}
