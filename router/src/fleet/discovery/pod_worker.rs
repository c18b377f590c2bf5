//! From a pod to the workers it runs: a pure function of the pod and the mapping settings,
//! one worker per target port, with the keys a `[[workers]]` entry has.
//!
//! | Worker key | From the pod |
//! |---|---|
//! | `name` | the pod's name (`<pod>-<port>` when the pool has several target ports) |
//! | `url` | `http://<podIP>:<port>` |
//! | `role` | the role label (`llm-d.ai/role`: `prefill`, `decode`, `both`) |
//! | `engine` | the engine label (`vllm`, `sglang`, `sim`) |
//! | `bootstrap_port` | annotation `sglang.ai/bootstrap-port` (one value, or one per port) |
//! | `kv_events` | the KV-events annotation, a template (`tcp://{podIP}:5557`; also `{port}`) |
//!
//! A pod is eligible when it is `Running`, its `Ready` condition is `True` and it is not
//! being deleted; a pod without an IP or a UID runs no worker at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use ownerserve_planner::ids::{EngineKind, Role, WorkerId};

use crate::config::WorkerSpec;

/// The SGLang prefill server's bootstrap port (SMG's annotation).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// How pods become workers.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMapping {
    /// One worker per port, each `podIP:port`.
    pub target_ports: Vec<u16>,
    /// The label whose value is the worker's role.
    pub role_label: String,
    /// The label whose value is the worker's engine.
    pub engine_label: String,
    /// The engine of a pod without the engine label.
    pub default_engine: EngineKind,
    /// The annotation holding the KV-events endpoint template.
    pub kv_events_annotation: String,
}

/// Which pod and port a discovered worker is: the pod's UID makes a recreated pod (same
/// name) a new worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey {
    pub uid: String,
    pub port: u16,
}

/// A worker a pod runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PodWorker {
    pub key: WorkerKey,
    /// Derived from the UID, port and IP, so every replica numbers it alike.
    pub id: WorkerId,
    pub spec: WorkerSpec,
    /// Ready, running, not being deleted: may take work.
    pub eligible: bool,
}

/// Why a pod runs no worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAWorker {
    #[error("pod `{0}` has no IP yet")]
    NoIp(String),
    #[error("a pod without a name or UID")]
    NoIdentity,
    #[error("pod `{pod}`: label `{label}` = `{value}` is not a known {what}")]
    BadLabel {
        pod: String,
        label: String,
        value: String,
        what: String,
    },
}

/// The workers `pod` runs under `mapping` (one per target port).
pub fn workers_of(pod: &Pod, mapping: &PodMapping) -> Result<Vec<PodWorker>, NotAWorker> {
    let meta = &pod.metadata;
    let (Some(name), Some(uid)) = (meta.name.as_deref(), meta.uid.as_deref()) else {
        return Err(NotAWorker::NoIdentity);
    };
    let status = pod.status.as_ref();
    let Some(ip) = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
    else {
        return Err(NotAWorker::NoIp(name.to_owned()));
    };
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let role = role_of(labels.get(&mapping.role_label), name, &mapping.role_label)?;
    let engine = match labels.get(&mapping.engine_label) {
        Some(v) => v.parse().map_err(|_| NotAWorker::BadLabel {
            pod: name.to_owned(),
            label: mapping.engine_label.clone(),
            value: v.clone(),
            what: format!("engine ({})", EngineKind::names()),
        })?,
        None => mapping.default_engine,
    };
    let eligible = is_eligible(pod);
    let bootstrap = annotations.get(BOOTSTRAP_PORT_ANNOTATION);
    let kv_events = annotations.get(&mapping.kv_events_annotation);
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    Ok(mapping
        .target_ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let worker_name = if mapping.target_ports.len() > 1 {
                format!("{name}-{port}")
            } else {
                name.to_owned()
            };
            let mut spec =
                WorkerSpec::new(&worker_name, &format!("http://{host}:{port}"), role, engine);
            spec.bootstrap_port = bootstrap.and_then(|b| nth_port(b, i));
            spec.kv_events = kv_events.map(|t| {
                t.replace("{podIP}", &host)
                    .replace("{port}", &port.to_string())
            });
            PodWorker {
                key: WorkerKey {
                    uid: uid.to_owned(),
                    port,
                },
                id: worker_id(uid, port, ip),
                spec,
                eligible,
            }
        })
        .collect())
}

/// Running, `Ready=True` and not being deleted (the rule of SMG and GIE's reference EPP).
pub fn is_eligible(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let running = status.phase.as_deref() == Some("Running");
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    running && ready && pod.metadata.deletion_timestamp.is_none()
}

/// The role a label value names (llm-d's `both` is a hybrid worker); no label: hybrid.
fn role_of(value: Option<&String>, pod: &str, label: &str) -> Result<Role, NotAWorker> {
    match value.map(String::as_str) {
        None | Some("both") => Ok(Role::Hybrid),
        Some(v) => v.parse().map_err(|_| NotAWorker::BadLabel {
            pod: pod.to_owned(),
            label: label.to_owned(),
            value: v.to_owned(),
            what: "role (prefill, decode, both, hybrid)".to_owned(),
        }),
    }
}

/// The `i`th port of a comma-separated list; a single value holds for every port.
fn nth_port(list: &str, i: usize) -> Option<u16> {
    let ports: Vec<&str> = list.split(',').map(str::trim).collect();
    let p = if ports.len() == 1 {
        ports[0]
    } else {
        ports.get(i)?
    };
    p.parse().ok()
}

/// A discovered worker's id: a hash of its pod's UID, port and IP with the top bit set, so
/// it never meets a configured worker's (numbered from 0) and every replica derives the
/// same one.
pub fn worker_id(uid: &str, port: u16, ip: &str) -> WorkerId {
    let h = xxhash_rust::xxh3::xxh3_64(format!("{uid}/{port}/{ip}").as_bytes());
    WorkerId((h as u32) | 0x8000_0000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn mapping(ports: &[u16]) -> PodMapping {
        PodMapping {
            target_ports: ports.to_vec(),
            role_label: "llm-d.ai/role".into(),
            engine_label: "ownerserve.io/engine".into(),
            default_engine: EngineKind::Vllm,
            kv_events_annotation: "ownerserve.io/kv-events".into(),
        }
    }

    fn pod(name: &str, ip: Option<&str>, phase: &str, ready: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: ip.map(Into::into),
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn labelled(mut p: Pod, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        p.metadata.labels = map(labels);
        p.metadata.annotations = map(annotations);
        p
    }

    /// (case, pod, ports, expected: Err, or per worker (name, url, role, engine,
    /// bootstrap, kv_events, eligible)).
    type Row = (
        &'static str,
        String,
        Role,
        EngineKind,
        Option<u16>,
        Option<String>,
        bool,
    );
    type Case = (&'static str, Pod, Vec<u16>, Result<Vec<Row>, NotAWorker>);

    #[test]
    #[expect(clippy::too_many_lines, reason = "a table of cases")]
    fn pods_map_to_workers() {
        let deleting = {
            let mut p = pod("d", Some("10.0.0.4"), "Running", "True");
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            p
        };
        let cases: Vec<Case> = vec![
            (
                "ready vllm pod, defaults",
                pod("a", Some("10.0.0.1"), "Running", "True"),
                vec![8000],
                Ok(vec![(
                    "a",
                    "http://10.0.0.1:8000".into(),
                    Role::Hybrid,
                    EngineKind::Vllm,
                    None,
                    None,
                    true,
                )]),
            ),
            (
                "not ready",
                pod("b", Some("10.0.0.2"), "Running", "False"),
                vec![8000],
                Ok(vec![(
                    "b",
                    "http://10.0.0.2:8000".into(),
                    Role::Hybrid,
                    EngineKind::Vllm,
                    None,
                    None,
                    false,
                )]),
            ),
            (
                "pending",
                pod("c", Some("10.0.0.3"), "Pending", "True"),
                vec![8000],
                Ok(vec![(
                    "c",
                    "http://10.0.0.3:8000".into(),
                    Role::Hybrid,
                    EngineKind::Vllm,
                    None,
                    None,
                    false,
                )]),
            ),
            (
                "being deleted",
                deleting,
                vec![8000],
                Ok(vec![(
                    "d",
                    "http://10.0.0.4:8000".into(),
                    Role::Hybrid,
                    EngineKind::Vllm,
                    None,
                    None,
                    false,
                )]),
            ),
            (
                "no IP yet",
                pod("e", None, "Pending", "False"),
                vec![8000],
                Err(NotAWorker::NoIp("e".into())),
            ),
            (
                "sglang prefill with per-port bootstrap ports and kv events, two ports",
                labelled(
                    pod("p", Some("10.0.0.5"), "Running", "True"),
                    &[
                        ("llm-d.ai/role", "prefill"),
                        ("ownerserve.io/engine", "sglang"),
                    ],
                    &[
                        ("sglang.ai/bootstrap-port", "8998, 8999"),
                        ("ownerserve.io/kv-events", "tcp://{podIP}:5557"),
                    ],
                ),
                vec![30000, 30001],
                Ok(vec![
                    (
                        "p-30000",
                        "http://10.0.0.5:30000".into(),
                        Role::Prefill,
                        EngineKind::Sglang,
                        Some(8998),
                        Some("tcp://10.0.0.5:5557".into()),
                        true,
                    ),
                    (
                        "p-30001",
                        "http://10.0.0.5:30001".into(),
                        Role::Prefill,
                        EngineKind::Sglang,
                        Some(8999),
                        Some("tcp://10.0.0.5:5557".into()),
                        true,
                    ),
                ]),
            ),
            (
                "decode, `both` is hybrid, one bootstrap port for all",
                labelled(
                    pod("q", Some("fd00::7"), "Running", "True"),
                    &[("llm-d.ai/role", "both")],
                    &[
                        ("sglang.ai/bootstrap-port", "8998"),
                        ("ownerserve.io/kv-events", "tcp://{podIP}:{port}"),
                    ],
                ),
                vec![8000],
                Ok(vec![(
                    "q",
                    "http://[fd00::7]:8000".into(),
                    Role::Hybrid,
                    EngineKind::Vllm,
                    Some(8998),
                    Some("tcp://[fd00::7]:8000".into()),
                    true,
                )]),
            ),
            (
                "unknown role",
                labelled(
                    pod("r", Some("10.0.0.8"), "Running", "True"),
                    &[("llm-d.ai/role", "encode")],
                    &[],
                ),
                vec![8000],
                Err(NotAWorker::BadLabel {
                    pod: "r".into(),
                    label: "llm-d.ai/role".into(),
                    value: "encode".into(),
                    what: "role (prefill, decode, both, hybrid)".to_owned(),
                }),
            ),
        ];
        for (case, pod, ports, expected) in cases {
            let got = workers_of(&pod, &mapping(&ports)).map(|ws| {
                ws.into_iter()
                    .map(|w| {
                        let s = w.spec;
                        let name: &'static str = Box::leak(s.name.into_boxed_str());
                        (
                            name,
                            s.base_url,
                            s.role,
                            s.engine,
                            s.bootstrap_port,
                            s.kv_events,
                            w.eligible,
                        )
                    })
                    .collect::<Vec<Row>>()
            });
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn ids_follow_the_uid_and_never_meet_configured_ones() {
        let a = pod("a", Some("10.0.0.1"), "Running", "True");
        let mut again = a.clone();
        again.metadata.uid = Some("uid-a-recreated".into());
        let m = mapping(&[8000, 8001]);
        let (first, second) = (
            workers_of(&a, &m).expect("a worker"),
            workers_of(&again, &m).expect("a worker"),
        );
        assert_ne!(first[0].id, second[0].id, "a recreated pod is a new worker");
        assert_ne!(first[0].id, first[1].id, "one worker per port");
        assert_eq!(first[0].id, workers_of(&a, &m).expect("a worker")[0].id);
        assert!(first.iter().all(|w| w.id.0 >= 0x8000_0000));
    }
}
