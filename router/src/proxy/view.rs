//! View: the planner's input for one step, built in one place from the directory (the
//! session's owner and epoch, the prompt's longest owned prefix), the KV index (each
//! worker's cached prefix) and the workers' health and load. The proxy and
//! `POST /admin/v1/plan/explain` both build it here, so explain shows what routing sees.

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::{RouteRequest, WorkerView};

use super::identity::Identity;
use crate::directory_client::{DirectoryClient, Lookup};
use crate::kv::KvRouting;
use crate::registry::Registry;

/// Which sources a policy reads (the others are not paid for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Match the prompt against the KV index.
    pub prefix_match: bool,
    /// Read the session's owner and the owned prefix from the directory.
    pub directory: bool,
}

impl Needs {
    /// Everything (a dry run explains the planner whatever routing uses).
    pub const ALL: Needs = Needs {
        prefix_match: true,
        directory: true,
    };
}

/// What one step's view is read from.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub registry: &'a Registry,
    pub kv: &'a KvRouting,
    pub directory: Option<&'a dyn DirectoryClient>,
}

/// The planner's request for a step, and what the directory said about it.
#[derive(Debug, Clone)]
pub struct StepView<'a> {
    pub route: RouteRequest<'a>,
    pub lookup: Lookup,
}

impl<'a> Sources<'a> {
    /// The step's request to the policy, with the directory read if `needs` says so.
    pub fn step(
        &self,
        model: &'a str,
        id: &'a Identity<'a>,
        samples: u32,
        needs: Needs,
    ) -> StepView<'a> {
        let block = self.kv.block_size() as u64;
        let lookup = match self.directory.filter(|_| needs.directory) {
            Some(d) => d.lookup(id.session, id.hashes(), block),
            None => Lookup::default(),
        };
        let route = RouteRequest {
            model,
            prompt_tokens: id.prompt_tokens(),
            block_size: block as u32,
            session: id.session,
            now_ms: self.kv.now_ms(),
            decode_owner: lookup.owner,
            artifact: lookup.artifact,
            samples,
            fork: id.fork,
        };
        StepView { route, lookup }
    }

    /// The healthy workers serving `model` but `excluded`, with their load and, if
    /// `needs` says so, the prompt's cached prefix on each.
    pub fn candidates(
        &self,
        model: &str,
        hashes: &[u64],
        excluded: &[WorkerId],
        needs: Needs,
    ) -> Vec<WorkerView> {
        let mut views = self.registry.candidates(model, excluded);
        if needs.prefix_match {
            self.kv.fill_cached(hashes, &mut views);
        }
        views
    }
}
