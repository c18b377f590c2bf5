//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`),
//! typed as far as OwnerServe reads it: the pod selector and the target ports, so the
//! gateway and OwnerServe share one pool object.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// API group and version.
pub const API_VERSION: &str = "inference.networking.k8s.io/v1";

/// An `InferencePool` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferencePool {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: InferencePoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Its `spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferencePoolSpec {
    pub selector: PoolSelector,
    /// 1 to 8 ports; each is a distinct endpoint `podIP:port`.
    pub target_ports: Vec<TargetPort>,
    /// `http` or `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

/// `spec.selector`: labels of the pool's pods (same namespace).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSelector {
    pub match_labels: BTreeMap<String, String>,
}

/// One `spec.targetPorts` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetPort {
    pub number: u16,
}

/// `spec.endpointPickerRef`: the EPP service the gateway asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPickerRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    pub port: EppPort,
    /// `FailOpen` or `FailClose` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<String>,
}

/// `endpointPickerRef.port`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EppPort {
    pub number: u16,
}

impl InferencePoolSpec {
    /// The label selector string (`k=v,k2=v2`) of `matchLabels`.
    pub fn label_selector(&self) -> String {
        self.selector
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The target port numbers.
    pub fn ports(&self) -> Vec<u16> {
        self.target_ports.iter().map(|p| p.number).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_gives_its_selector_and_ports_and_unknown_fields_fail() {
        let pool: InferencePool = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "InferencePool",
            "metadata": {"name": "llm", "namespace": "serving"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm", "tier": "gpu"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
                "endpointPickerRef": {"name": "ownerserve-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
            }
        }))
        .expect("a valid pool");
        assert_eq!(pool.spec.label_selector(), "app=vllm,tier=gpu");
        assert_eq!(pool.spec.ports(), vec![8000, 8001]);
        let wrong = serde_json::from_value::<InferencePool>(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "InferencePool", "metadata": {},
            "spec": {"selector": {"matchLabels": {}}, "targetPort": [{"number": 8000}]}
        }));
        assert!(wrong.is_err(), "a misspelt field fails");
    }
}
