//! The `[kubernetes]` table and its flags: worker discovery from the Kubernetes API (pods
//! by label selector, or a named `InferencePool`). Parsed whether or not the binary has
//! the `kubernetes` feature; a binary without it refuses a config that turns it on.

use std::time::Duration;

use serde::Deserialize;

use ownerserve_planner::ids::EngineKind;

use super::ConfigError;

/// The `[kubernetes]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSettings {
    /// Watch pods matching this label selector (`app=vllm,tier=gpu`, any selector syntax).
    pub selector: Option<String>,
    /// Or take the selector and target ports from this `InferencePool`.
    pub inference_pool: Option<String>,
    /// The namespace watched (default: `POD_NAMESPACE`, else `default`).
    pub namespace: Option<String>,
    /// One worker per pod and port, `podIP:port` (with `selector`; a pool names its own).
    pub target_ports: Vec<u16>,
    /// The label whose value is a pod's role (`prefill`, `decode`, `both`).
    pub role_label: String,
    /// The label whose value is a pod's engine (`vllm`, `sglang`, `sim`).
    pub engine_label: String,
    /// The engine of pods without the engine label.
    pub default_engine: EngineKind,
    /// The annotation holding a pod's KV-events endpoint template (`tcp://{podIP}:5557`).
    pub kv_events_annotation: String,
    /// The API server's URL (default: in-cluster config, else the kubeconfig); for
    /// `kubectl proxy` (`http://127.0.0.1:8001`) and tests.
    pub api_server: Option<String>,
    /// Every this many seconds the whole pod set is reconciled, events or not.
    pub resync_s: u64,
    /// Events within this many ms are reconciled in one pass.
    pub coalesce_ms: u64,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            selector: None,
            inference_pool: None,
            namespace: None,
            target_ports: vec![8000],
            role_label: "llm-d.ai/role".to_owned(),
            engine_label: "ownerserve.io/engine".to_owned(),
            default_engine: EngineKind::Vllm,
            kv_events_annotation: "ownerserve.io/kv-events".to_owned(),
            api_server: None,
            resync_s: 60,
            coalesce_ms: 100,
        }
    }
}

/// Where the watched pods' selector and ports come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSource {
    Selector { selector: String, ports: Vec<u16> },
    InferencePool(String),
}

/// The validated discovery settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoverySetup {
    pub source: PodSource,
    pub namespace: String,
    pub role_label: String,
    pub engine_label: String,
    pub default_engine: EngineKind,
    pub kv_events_annotation: String,
    pub api_server: Option<String>,
    pub resync: Duration,
    pub coalesce: Duration,
}

impl KubernetesSettings {
    /// The discovery setup, `None` when neither a selector nor a pool is set.
    pub fn validate(&self) -> Result<Option<DiscoverySetup>, ConfigError> {
        let bad = |key: &str, why: &str| ConfigError::invalid("kubernetes", key, why);
        let source = match (&self.selector, &self.inference_pool) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(bad("selector", "set either selector or inference_pool"))
            }
            (Some(s), None) if s.trim().is_empty() => {
                return Err(bad("selector", "must not be empty"))
            }
            (Some(s), None) => {
                if self.target_ports.is_empty() || self.target_ports.contains(&0) {
                    return Err(bad("target_ports", "list one or more ports, none 0"));
                }
                PodSource::Selector {
                    selector: s.clone(),
                    ports: self.target_ports.clone(),
                }
            }
            (None, Some(p)) => PodSource::InferencePool(p.clone()),
        };
        if !cfg!(feature = "kubernetes") {
            return Err(bad(
                "selector",
                "this binary was built without the `kubernetes` feature",
            ));
        }
        let namespace = self
            .namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_owned());
        Ok(Some(DiscoverySetup {
            source,
            namespace,
            role_label: self.role_label.clone(),
            engine_label: self.engine_label.clone(),
            default_engine: self.default_engine,
            kv_events_annotation: self.kv_events_annotation.clone(),
            api_server: self.api_server.clone(),
            resync: Duration::from_secs(self.resync_s.max(1)),
            coalesce: Duration::from_millis(self.coalesce_ms),
        }))
    }
}

/// Flags (or their `OWNERSERVE_K8S_*` variables) over the `[kubernetes]` table.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubernetesOverrides {
    /// Discover workers: pods matching this label selector.
    #[arg(long = "k8s-selector", env = "OWNERSERVE_K8S_SELECTOR")]
    pub selector: Option<String>,
    /// Discover workers: the pods of this InferencePool (its selector and target ports).
    #[arg(long = "k8s-inference-pool", env = "OWNERSERVE_K8S_INFERENCE_POOL")]
    pub inference_pool: Option<String>,
    /// The namespace watched.
    #[arg(long = "k8s-namespace", env = "OWNERSERVE_K8S_NAMESPACE")]
    pub namespace: Option<String>,
    /// Target ports of the selected pods (comma-separated).
    #[arg(long = "k8s-port", env = "OWNERSERVE_K8S_PORT", value_delimiter = ',')]
    pub target_ports: Option<Vec<u16>>,
    /// The API server's URL (default: in-cluster, else the kubeconfig).
    #[arg(long = "k8s-api-server", env = "OWNERSERVE_K8S_API_SERVER")]
    pub api_server: Option<String>,
}

impl KubernetesOverrides {
    /// Applies the overrides that are set.
    pub fn apply(&self, s: &mut KubernetesSettings) {
        if self.selector.is_some() {
            s.selector.clone_from(&self.selector);
        }
        if self.inference_pool.is_some() {
            s.inference_pool.clone_from(&self.inference_pool);
        }
        if self.namespace.is_some() {
            s.namespace.clone_from(&self.namespace);
        }
        if let Some(p) = &self.target_ports {
            s.target_ports.clone_from(p);
        }
        if self.api_server.is_some() {
            s.api_server.clone_from(&self.api_server);
        }
    }
}
