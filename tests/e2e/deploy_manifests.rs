//! Every manifest in `deploy/` parses into the typed Kubernetes structs (k8s-openapi, and
//! OwnerServe's own `InferencePool`), and says nothing those structs drop: each document
//! is read, turned back into JSON and compared, so a misspelt or misplaced field fails here
//! rather than at `kubectl apply`. The RBAC grants what discovery reads; the router and
//! EPP flags and config keys the manifests use are ones the binary accepts.
#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use ownerserve_router::config::RouterFile;
use ownerserve_router::fleet::discovery::inference_pool::InferencePool;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every document of every manifest, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", f.display()));
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        out.extend(
            docs.into_iter()
                .filter(|d| !d.is_null())
                .map(|d| (name.clone(), d)),
        );
    }
    out
}

/// `doc` as `T`, and back: nothing may be lost on the way.
fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", doc["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    let mut lost = Vec::new();
    differences("", doc, &back, &mut lost);
    assert!(
        lost.is_empty(),
        "{file}: {} fields dropped or changed by the typed struct (misspelt or misplaced?): {lost:?}",
        doc["kind"]
    );
    t
}

/// The paths where `want` and `got` differ.
fn differences(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let p = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => differences(&p, v, gv, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                differences(&format!("{path}[{i}]"), a, b, out);
            }
        }
        (w, g) if w != g => out.push(format!("{path}: {w} became {g}")),
        _ => {}
    }
}

#[test]
fn every_manifest_parses_into_typed_kubernetes_objects() {
    let mut kinds = Vec::new();
    for (file, doc) in documents() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "Deployment" => drop(typed::<Deployment>(&file, &doc)),
            "StatefulSet" => drop(typed::<StatefulSet>(&file, &doc)),
            "Service" => drop(typed::<Service>(&file, &doc)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(&file, &doc)),
            "Role" => drop(typed::<Role>(&file, &doc)),
            "RoleBinding" => drop(typed::<RoleBinding>(&file, &doc)),
            "ConfigMap" => {
                let cm = typed::<ConfigMap>(&file, &doc);
                for (key, text) in cm.data.unwrap_or_default() {
                    if key.ends_with(".toml") {
                        toml::from_str::<RouterFile>(&text).unwrap_or_else(|e| {
                            panic!("{file}: {key} is not a router config: {e}")
                        });
                    }
                }
            }
            "InferencePool" => {
                let pool = typed::<InferencePool>(&file, &doc);
                assert!(!pool.spec.selector.match_labels.is_empty());
                assert!((1..=8).contains(&pool.spec.target_ports.len()));
            }
            other => panic!("{file}: no typed check for kind `{other}`"),
        }
        kinds.push(kind);
    }
    for want in [
        "Deployment",
        "StatefulSet",
        "Role",
        "RoleBinding",
        "InferencePool",
        "Service",
    ] {
        assert!(kinds.iter().any(|k| k == want), "no {want} in deploy/");
    }
}

#[test]
fn the_role_grants_what_discovery_reads() {
    let role = documents()
        .into_iter()
        .find(|(_, d)| d["kind"] == "Role")
        .map(|(f, d)| typed::<Role>(&f, &d))
        .unwrap();
    let grants = |group: &str, resource: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && ["get", "list", "watch"]
                    .iter()
                    .all(|v| r.verbs.iter().any(|x| x == v))
        })
    };
    assert!(grants("", "pods"));
    assert!(grants("inference.networking.k8s.io", "inferencepools"));
}

#[test]
fn the_containers_flags_are_ones_the_binary_takes() {
    for (file, doc) in documents() {
        if doc["kind"] != "Deployment" {
            continue;
        }
        let d: Deployment = typed(&file, &doc);
        for c in d.spec.unwrap().template.spec.unwrap().containers {
            let args = c.args.unwrap_or_default();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_ownerserve"))
                .args(&args)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{file}: `ownerserve {}` is refused: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let doc = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"replica": 2, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"spec": {"containers": [{"name": "c", "imagePullPolicy": "Always"}]}}}
    });
    let d: Deployment = serde_json::from_value(doc.clone()).unwrap();
    let mut lost = Vec::new();
    differences("", &doc, &serde_json::to_value(&d).unwrap(), &mut lost);
    assert_eq!(lost, vec![".spec.replica".to_owned()]);
}
