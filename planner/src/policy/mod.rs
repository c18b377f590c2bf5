//! Routing policies. Every policy (OwnerServe's planner and each baseline) implements
//! [`Policy`], so the live router and the trace simulator share one implementation.
//! Policies are pure: no IO, no clock; state they keep (a cursor, an RNG) is their own.

mod least_loaded;
mod round_robin;

pub use least_loaded::LeastLoaded;
pub use round_robin::RoundRobin;

use crate::ids::{Role, WorkerId};

/// What the router knows about one worker when it routes a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerView {
    pub id: WorkerId,
    pub role: Role,
    pub healthy: bool,
    /// Requests the router has sent there that have not finished.
    pub in_flight: u32,
}

/// What a policy knows about the request being routed.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// The `model` the client asked for; candidates already serve it.
    pub model: &'a str,
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub worker: WorkerId,
}

/// Why a policy could not place a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("no healthy worker can serve this request")]
    NoHealthyWorker,
}

/// A routing policy.
pub trait Policy: Send {
    /// The name `--policy` selects it by.
    fn name(&self) -> &'static str;

    /// Picks a worker among `workers` (the candidates serving the request's model).
    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError>;
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &["round_robin", "least_loaded"];

/// A policy that is not one we have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (available: round_robin, least_loaded)")]
pub struct UnknownPolicy(pub String);

/// Builds a policy from its name.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, UnknownPolicy> {
    match name {
        "round_robin" => Ok(Box::new(RoundRobin::default())),
        "least_loaded" => Ok(Box::new(LeastLoaded::default())),
        _ => Err(UnknownPolicy(name.to_owned())),
    }
}

/// Candidates a plain (non-disaggregated) request may go to: healthy decode or hybrid
/// workers, or, in a fleet that has none, any healthy worker (a prefill-only engine still
/// serves whole requests).
pub(crate) fn full_request_candidates(
    workers: &[WorkerView],
) -> impl Iterator<Item = &WorkerView> + '_ {
    let any_full = workers
        .iter()
        .any(|w| w.healthy && w.role.serves_full_requests());
    workers
        .iter()
        .filter(move |w| w.healthy && (!any_full || w.role.serves_full_requests()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_builds_and_reports_its_name() {
        for name in POLICY_NAMES {
            assert_eq!(by_name(name).unwrap().name(), *name);
        }
        assert_eq!(
            by_name("nope").err(),
            Some(UnknownPolicy("nope".to_owned()))
        );
    }
}
