//! `ownerserve epp` replicas, the simulated workers behind them and the shared directory's
//! config, as the endpoint-picker tests (`e2e_epp`, `e2e_envoy_epp`) set them up.

use std::time::Duration;

use super::{eventually, get_json, temp_config, DirectoryNodes, Proc};

/// A running `ownerserve epp`: its operator API (`proc.url`) and its gRPC ports.
pub struct Epp {
    pub proc: Proc,
    /// The ext_proc port, and `http://127.0.0.1:PORT` of it.
    pub grpc_port: u16,
    pub grpc: String,
    /// `http://127.0.0.1:PORT` of the gRPC health port.
    pub health: String,
}

/// Starts `ownerserve epp --config <config>` with `--worker` flags and `extra` flags. Its
/// gRPC ports are bound by the replica itself (`0`) and read from the line it prints: a
/// port probed free here could be taken by another test's process before the replica binds
/// it (a CI run lost a replica that way).
pub fn spawn(config: &str, workers: &[String], extra: &[&str]) -> Epp {
    let mut args = vec![
        "epp",
        "--config",
        config,
        "--port",
        "0",
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
    ];
    for w in workers {
        args.push("--worker");
        args.push(w);
    }
    args.extend_from_slice(extra);
    // `OWNERSERVE_TEST_EPP_LOG` (a log filter) makes the replicas talk, to debug a run.
    let log = std::env::var("OWNERSERVE_TEST_EPP_LOG").ok();
    let envs: Vec<(&str, &str)> = log.iter().map(|l| ("OWNERSERVE_LOG", l.as_str())).collect();
    let proc = Proc::spawn(&args, &envs, "operator API on");
    let announced = proc.lines.last().expect("the marker line").clone();
    let port_after = |label: &str| -> u16 {
        announced
            .split(label)
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|addr| addr.trim().rsplit(':').next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no `{label}` address in {announced:?}"))
    };
    let (g, h) = (port_after("ext_proc on "), port_after("grpc health on "));
    Epp {
        proc,
        grpc_port: g,
        grpc: format!("http://127.0.0.1:{g}"),
        health: format!("http://127.0.0.1:{h}"),
    }
}

/// `n` simulated workers (`sim-worker <extra>`): the processes, their `--worker` flags
/// (`name=w<i>`) and their `host:port` endpoints.
pub fn sims(n: usize, extra: &[&str]) -> (Vec<Proc>, Vec<String>, Vec<String>) {
    let procs: Vec<Proc> = (0..n).map(|_| Proc::sim_worker(extra)).collect();
    let flags = procs
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{},engine=sim,name=w{i}", p.url))
        .collect();
    let endpoints = procs
        .iter()
        .map(|p| p.url.trim_start_matches("http://").to_owned())
        .collect();
    (procs, flags, endpoints)
}

/// Waits until the replica at `api` counts `n` workers healthy.
pub async fn healthy(api: &str, n: usize) {
    let api = api.to_owned();
    eventually(Duration::from_secs(10), "workers healthy", || {
        let api = api.clone();
        async move {
            get_json(&format!("{api}/admin/v1/workers")).await["workers"]
                .as_array()
                .is_some_and(|w| w.iter().filter(|w| w["healthy"] == true).count() == n)
        }
    })
    .await;
}

/// A config file for replicas sharing `nodes` as their directory (policy `ownerserve`).
pub fn remote_config(name: &str, nodes: &DirectoryNodes) -> String {
    temp_config(
        name,
        &format!(
            "[router]\npolicy = \"ownerserve\"\ndirectory = \"remote\"\ndirectory_urls = [\"{}\"]\n\
             directory_secret = \"{}\"\nhealth_interval_ms = 200\nworker_lease_ttl_ms = 6000\n",
            nodes.url(1),
            super::CLUSTER_SECRET
        ),
    )
}
