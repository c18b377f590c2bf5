//! Worker discovery from the Kubernetes API (feature `kubernetes`), beside the static
//! `[[workers]]` list: pods in one namespace, selected by a label selector or by a named
//! `InferencePool`, become workers; pods that go away are drained and retired.
//!
//! # Layout
//! - `pod_worker`: the pure mapping from a pod to its workers (name, URL per target port,
//!   role, engine, bootstrap port, KV-events endpoint, eligibility), with its table tests.
//! - `reconcile`: the pure diff of wanted against joined workers, applied to the registry.
//! - `inference_pool`: the typed `InferencePool` (`inference.networking.k8s.io/v1`).
//! - `watch`: the kube watcher and reflector feeding the level-triggered reconcile loop.

pub mod inference_pool;
pub mod pod_worker;
pub mod reconcile;
pub mod watch;

pub use watch::{run, DiscoveryError};
