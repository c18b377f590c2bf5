//! `ownerserve up`: the router plus a fleet of simulated workers in one process, on the
//! embedded default config (`configs/up.toml`) unless told otherwise.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::ids::EngineKind;

use crate::config::{
    read_toml, DirectoryMode, RouterConfig, RouterOverrides, UpFile, WorkerSpec, DEFAULT_UP_TOML,
};
use crate::ops::ha_directory::HaDirectory;
use crate::ops::logging::LogFormat;
use crate::server;
use ownerserve_edge::process::{bind, cancel_on_signal, say};

/// Flags of `ownerserve up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Config file; defaults to the embedded configs/up.toml.
    #[arg(long, env = "OWNERSERVE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: RouterOverrides,
    /// Simulated seconds per wall-clock second for every worker.
    #[arg(long, env = "OWNERSERVE_TIME_SCALE")]
    time_scale: Option<f64>,
    /// Workers finish steps instantly (no simulated delay).
    #[arg(long, env = "OWNERSERVE_INSTANT")]
    instant: Option<bool>,
    /// The production topology on one machine: the ownership directory as a 3-node Raft
    /// cluster of `ownerserve directory` processes sharing a fresh cluster secret, and two
    /// routers (on the port and the port + 1), each with its own live replica of it.
    #[arg(long)]
    ha: bool,
}

impl UpArgs {
    /// The `worker_threads` this run asks for (flag, env, file or the embedded default);
    /// `None` when the config does not load, which `run` then reports.
    pub fn worker_threads(&self) -> Option<usize> {
        if let Some(n) = self.overrides.worker_threads {
            return Some(n);
        }
        let file: UpFile = match &self.config {
            Some(path) => read_toml(path).ok()?,
            None => toml::from_str(DEFAULT_UP_TOML).ok()?,
        };
        Some(file.router.worker_threads)
    }
}

/// Starts everything, prints what runs, and waits for Ctrl-C.
#[expect(
    clippy::too_many_lines,
    reason = "the whole stack's start-up, read top to bottom; not the request path"
)]
pub async fn run(args: UpArgs, log: Option<LogFormat>) -> anyhow::Result<()> {
    let mut file: UpFile = match &args.config {
        Some(path) => read_toml(path)?,
        None => toml::from_str(DEFAULT_UP_TOML).context("embedded configs/up.toml")?,
    };
    crate::ops::logging::init(log.unwrap_or(file.router.log_format));
    file.router.warn_deprecated();
    args.overrides.apply(&mut file.router);
    if let Some(scale) = args.time_scale {
        file.sim.time_scale = scale;
    }
    if let Some(instant) = args.instant {
        file.sim.instant = instant;
    }
    let sim = file.sim.build().context("invalid [sim] settings")?;
    // The planner prices plans for the fleet it fronts.
    file.router.planner_model.clone_from(&file.sim.model);
    file.router.planner_gpu.clone_from(&file.sim.gpu);
    file.router.planner_gpus = file.sim.gpus;
    file.router.planner_link_gbs = Some(file.sim.link_gbs);
    file.router.planner_link_latency_us = file.sim.link_latency_us;
    file.router.planner_max_num_batched_tokens = Some(u64::from(file.sim.max_num_batched_tokens));
    file.router.planner_long_prefill_token_threshold =
        Some(u64::from(file.sim.long_prefill_token_threshold));
    file.router.planner_time_scale = file.sim.time_scale;
    file.router.planner_calibrate = !file.sim.instant;
    if file.fleet.iter().all(|g| g.count == 0) {
        anyhow::bail!("the fleet is empty: add [[fleet]] groups with count >= 1");
    }
    // Validate the router settings before starting any worker.
    let placeholder = vec![WorkerSpec::new(
        "check",
        "http://127.0.0.1:1",
        file.fleet[0].role,
        EngineKind::Sim,
    )];
    RouterConfig::validate(&file.router, placeholder)?;
    let router_listener = bind(SocketAddr::new(file.router.host, file.router.port)).await?;
    // The second router of `--ha` on the next port (any free one when the first is too).
    let second_port = match file.router.port {
        0 => 0,
        p => p
            .checked_add(1)
            .context("no port after 65535 for the second router")?,
    };
    let second_listener = match args.ha {
        true => Some(bind(SocketAddr::new(file.router.host, second_port)).await?),
        false => None,
    };

    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &tracker)?;
    let ha = match args.ha {
        true => Some(start_ha_directory(&mut file.router, &tracker).await?),
        false => None,
    };
    let mut workers = Vec::new();
    for group in &file.fleet {
        let sim = match &group.gpu {
            Some(gpu) => {
                let mut s = file.sim.clone();
                s.gpu.clone_from(gpu);
                s.build()
                    .with_context(|| format!("[[fleet]] {} gpu {gpu}", group.role.as_str()))?
            }
            None => sim.clone(),
        };
        for i in 0..group.count {
            let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            let addr = listener.local_addr()?;
            let name = format!("{}-{i}", group.role.as_str());
            // Port-0 endpoints in the config give every worker its own event sockets.
            let publisher = ownerserve_shim::sim::server::bind_publisher(&sim).await?;
            let kv_events = publisher.as_ref().map(|p| p.endpoint.clone());
            let kv_replay = publisher.as_ref().and_then(|p| p.replay_endpoint.clone());
            let (cfg, token) = (sim.clone(), shutdown.child_token());
            let worker_name = name.clone();
            tracker.spawn(async move {
                if let Err(e) =
                    ownerserve_shim::sim::server::serve(listener, cfg, publisher, token).await
                {
                    tracing::error!(worker = %worker_name, error = %e, "sim worker failed");
                }
            });
            workers.push(WorkerSpec {
                kv_events,
                kv_replay,
                gpu: group.gpu.clone(),
                ..WorkerSpec::new(
                    &name,
                    &format!("http://{addr}"),
                    group.role,
                    EngineKind::Sim,
                )
            });
        }
    }
    let cfg = RouterConfig::validate(&file.router, workers)?;
    let router_addr = router_listener.local_addr()?;
    let second_addr = second_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    cfg.announce_token();
    print_summary(
        &cfg,
        router_addr,
        &sim.served_model_name,
        &file.sim,
        ha.as_ref().zip(second_addr),
    );

    let result = match second_listener {
        Some(second) => {
            let (a, b) = tokio::join!(
                server::run(router_listener, cfg.clone(), shutdown.clone()),
                server::run(second, cfg, shutdown.clone()),
            );
            a.and(b)
        }
        None => server::run(router_listener, cfg, shutdown.clone()).await,
    };
    drop(ha);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    say("ownerserve stopped");
    result
}

/// Starts the 3-node directory and points the router at it (with the nodes' secret and,
/// for their operator API, the router's admin token, generated now if unset).
async fn start_ha_directory(
    router: &mut crate::config::RouterSettings,
    tracker: &TaskTracker,
) -> anyhow::Result<HaDirectory> {
    let token = match &router.admin_token {
        Some(t) => t.clone(),
        None => ownerserve_edge::auth::random_token()?,
    };
    router.admin_token = Some(token.clone());
    let ha = HaDirectory::start(&token, tracker).await?;
    router.directory = DirectoryMode::Remote;
    router.directory_urls.clone_from(&ha.urls);
    router.directory_secret = Some(ha.secret.clone());
    Ok(ha)
}

/// The HA topology's lines of the summary: the second router, the directory's nodes, and
/// commands that work pasted.
fn print_ha(ha: &HaDirectory, first: SocketAddr, second: SocketAddr, token: &str) {
    say(&format!(
        "second router listening on http://{second} (same fleet, its own replica of the directory)"
    ));
    say(&format!(
        "ownership directory: 3 Raft nodes (separate processes sharing a cluster secret) at {}",
        ha.urls.join(" ")
    ));
    say(&format!(
        "  OWNERSERVE_ADMIN_TOKEN={token} ownerserve ctl --url http://{first} cluster --router http://{second}"
    ));
    say(&format!(
        "  curl -s -H \"x-ownerserve-cluster-secret: {}\" {}/directory/v1/cluster",
        ha.secret, ha.urls[0]
    ));
}

fn print_summary(
    cfg: &RouterConfig,
    addr: SocketAddr,
    model: &str,
    sim: &ownerserve_shim::sim::config::SimSettings,
    ha: Option<(&HaDirectory, SocketAddr)>,
) {
    let timing = if sim.instant {
        "instant".to_owned()
    } else {
        format!("time scale {}x", sim.time_scale)
    };
    say(&format!(
        "ownerserve up: {} simulated workers ({} on {}x {}, {timing})",
        cfg.workers.len(),
        model,
        sim.gpus,
        sim.gpu
    ));
    for w in &cfg.workers {
        say(&format!(
            "  worker {:<10} {:<8} {}",
            w.name,
            w.role.as_str(),
            w.base_url
        ));
    }
    say(&format!(
        "ownerserve router listening on http://{addr} (policy {})",
        cfg.policy
    ));
    say("try:");
    say(&format!(
        "  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    \
         -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":32}}'"
    ));
    // The real token, so the lines work when pasted.
    let token = cfg.tokens.admin();
    say(&format!(
        "  curl -s -H \"Authorization: Bearer {token}\" http://{addr}/admin/v1/workers"
    ));
    say(&format!(
        "  OWNERSERVE_ADMIN_TOKEN={token} ownerserve ctl --url http://{addr} workers"
    ));
    if let Some((ha, second)) = ha {
        print_ha(ha, addr, second, token);
    }
    say("press Ctrl-C to stop");
}
