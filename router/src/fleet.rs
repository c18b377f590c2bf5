//! The workers: who they are and whether they are up ([`registry`], `health`, and, with
//! feature `kubernetes`, `discovery` and the tasks of workers joining at run time,
//! `worker_tasks`), what each engine reports about itself (`engine_report`,
//! `step_budget`), and what they hold ([`kv`]: the KV index, its event subscribers and
//! load scrapers; [`kv_copy`]: a starting router's copy of a peer's index).

#[cfg(feature = "kubernetes")]
pub mod discovery;
pub(crate) mod engine_report;
pub(crate) mod health;
pub mod kv;
pub mod kv_copy;
pub mod registry;
pub(crate) mod step_budget;
pub(crate) mod worker_tasks;
