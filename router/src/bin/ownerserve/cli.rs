//! The command line. Each subcommand loads its config (file < env < flags), validates it,
//! then binds and runs until Ctrl-C.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_shim::sim::config::SimSettings;

use ownerserve_edge::process::{bind, cancel_on_signal, say};
use ownerserve_router::config::{
    parse_worker_flag, read_toml, worker_specs, KubernetesOverrides, RouterConfig, RouterFile,
    RouterOverrides, RouterSettings,
};
use ownerserve_router::ops::logging::{self, LogFormat};
use ownerserve_router::ops::up;
use ownerserve_router::server;

/// OwnerServe: an ownership-aware control plane for agentic LLM serving.
#[derive(Debug, Parser)]
#[command(name = "ownerserve", version)]
pub struct Cli {
    /// Log lines as text or JSON (`up` and `router` default to the config's `log_format`).
    #[arg(long, global = true, env = "OWNERSERVE_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole stack on this machine: the router plus a fleet of simulated workers.
    Up(up::UpArgs),
    /// Run the router in front of workers given in a config file or with --worker.
    Router(RouterArgs),
    /// Run the Gateway API Inference Extension endpoint picker: an Envoy ext_proc server
    /// that answers each request's `x-gateway-destination-endpoint` with its session's
    /// owner, beside the router's operator API (takes the router's config and flags).
    #[cfg(feature = "kubernetes")]
    Epp(EppArgs),
    /// Run one simulated GPU worker speaking vLLM's OpenAI API and metrics.
    SimWorker(SimWorkerArgs),
    /// Run one node of the replicated ownership directory.
    Directory(ownerserve_ownership::node::DirectoryArgs),
    /// Benchmarks (they print figures against a baseline measured in the same run).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run a workload through the trace simulator (virtual time) under one or more policies.
    Simulate(ownerserve_eval::commands::SimulateArgs),
    /// Run every policy over a workload on several clusters; write a Markdown report and plots.
    Report(ownerserve_eval::commands::ReportArgs),
    /// Drive a running router with a workload over HTTP and measure TTFT/E2E at the client.
    Replay(ownerserve_eval::commands::ReplayArgs),
    /// The operator API from the command line: owners, leases, sessions, workers, drain,
    /// cluster, plan explain.
    Ctl(ownerserve_router::ctl::CtlArgs),
    /// Fuzz every parser that takes outside bytes (OpenAI bodies, KV events, the SSE relay,
    /// directory entries, config) with a mutation engine; fails on any panic.
    Fuzz(crate::fuzz::FuzzArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Router overhead as a proxy: a sim worker driven directly and through the router (wrk).
    Proxy(ownerserve_bench::proxy::BenchArgs),
    /// KV routing hot paths: prompt hashing, event ingest, prefix match + cost.
    Kv(ownerserve_bench::kv::KvBenchArgs),
    /// Ownership writes on a local 3-node directory cluster, and memory for 1M sessions.
    Directory(ownerserve_bench::directory::DirectoryBenchArgs),
    /// 1, 2, 4 routers sharing one directory in front of one sim fleet: throughput, CPU
    /// per request and ownership held across them.
    Replicas(ownerserve_bench::replicas::ReplicasArgs),
    /// Planner decision latency (hash + plan) over a fleet for a long prompt.
    Planner(ownerserve_bench::planner::PlannerBenchArgs),
    /// A flood of concurrent long streams against `up`: served, shed, unanswered, /health
    /// latency and router memory, per policy.
    Overload(ownerserve_bench::overload::OverloadArgs),
    /// Admission classes under overload: interactive time to first token unloaded, beside
    /// batch and background floods, and with the floods unlabelled (one class).
    Classes(ownerserve_bench::classes::ClassesArgs),
    /// `up --ha`'s topology for N minutes under agent traffic with a fault every few
    /// minutes: memory, descriptors, tasks, p99 TTFT, lost writes and directory invariants.
    Soak(ownerserve_bench::soak::SoakArgs),
    /// Trace simulator throughput (10,000 agent requests; an hour of Mooncake traffic).
    Sim(ownerserve_bench::sim::SimBenchArgs),
    /// A model's own tokenizer on an agent-sized chat prompt, from scratch and as a
    /// session's next step, next to the built-in tokenizer.
    Tokenize(ownerserve_bench::tokenize::TokenizeBenchArgs),
    /// The router's CPU for an agent session's first request (Claude Code's, 88 KB), after
    /// an earlier session sent the same system prompt and tools, and cold.
    FirstStep(ownerserve_bench::first_step::FirstStepArgs),
}

#[derive(Debug, clap::Args)]
struct RouterArgs {
    /// Router config file (TOML with a `[router]` table and `[[workers]]` entries).
    #[arg(long, env = "OWNERSERVE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: RouterOverrides,
    /// A worker, `URL[,role=prefill|decode|hybrid][,engine=vllm|sglang|sim][,name=N]`;
    /// repeatable, added to the file's workers.
    #[arg(long = "worker")]
    workers: Vec<String>,
    #[command(flatten)]
    kubernetes: KubernetesOverrides,
}

#[cfg(feature = "kubernetes")]
#[derive(Debug, clap::Args)]
struct EppArgs {
    #[command(flatten)]
    router: RouterArgs,
    #[command(flatten)]
    epp: ownerserve_router::epp::EppFlags,
}

#[derive(Debug, clap::Args)]
struct SimWorkerArgs {
    /// Address to listen on.
    #[arg(long, env = "OWNERSERVE_SIM_HOST", default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "OWNERSERVE_SIM_PORT", default_value_t = 8000)]
    port: u16,
    #[command(flatten)]
    settings: SimSettings,
}

impl Cli {
    /// Runtime threads for this command (see `RouterSettings::worker_threads`): what the
    /// router's config asks for with `router` and `up`, one per core (0) for the rest. Read
    /// before the runtime starts; a config that does not load falls back to the default
    /// here and is reported by [`Cli::run`].
    pub fn worker_threads(&self) -> usize {
        let asked = match &self.command {
            #[cfg(feature = "kubernetes")]
            Command::Epp(EppArgs { router: args, .. }) => args.threads(),
            Command::Router(args) => args.threads(),
            Command::Up(args) => args.worker_threads(),
            _ => return 0,
        };
        asked.unwrap_or(RouterSettings::default().worker_threads)
    }
}

impl RouterArgs {
    /// The runtime threads its flags or config ask for.
    fn threads(&self) -> Option<usize> {
        let args = self;
        args.overrides
            .worker_threads
            .or_else(|| match &args.config {
                Some(path) => read_toml::<RouterFile>(path)
                    .ok()
                    .map(|f| f.router.worker_threads),
                None => None,
            })
    }
}

impl Cli {
    /// Runs the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let log = self.log_format;
        // `up` and `router` set up their own logs; `fuzz` makes millions of failures on
        // purpose, whose warnings would drown its report.
        let own_logs = match self.command {
            Command::Up(_) | Command::Router(_) | Command::Fuzz(_) => true,
            #[cfg(feature = "kubernetes")]
            Command::Epp(_) => true,
            _ => false,
        };
        if !own_logs {
            logging::init(log.unwrap_or_default());
        }
        match self.command {
            Command::Up(args) => up::run(args, log).await,
            Command::Router(args) => run_router(args, log).await,
            #[cfg(feature = "kubernetes")]
            Command::Epp(args) => run_epp(args, log).await,
            Command::Ctl(args) => ownerserve_router::ctl::run(args).await,
            Command::Fuzz(args) => {
                tokio::task::spawn_blocking(move || crate::fuzz::fuzz(&args)).await?
            }
            Command::SimWorker(args) => run_sim_worker(args).await,
            Command::Directory(args) => Ok(ownerserve_ownership::node::run(args).await?),
            Command::Bench(BenchCommand::Proxy(args)) => {
                tokio::task::spawn_blocking(move || ownerserve_bench::proxy::run(args)).await?
            }
            Command::Bench(BenchCommand::Directory(args)) => {
                ownerserve_bench::directory::run(args).await
            }
            Command::Bench(BenchCommand::Replicas(args)) => {
                ownerserve_bench::replicas::run(args).await
            }
            Command::Bench(BenchCommand::Overload(args)) => {
                ownerserve_bench::overload::run(args).await
            }
            Command::Bench(BenchCommand::Soak(args)) => ownerserve_bench::soak::run(args).await,
            Command::Bench(BenchCommand::Classes(args)) => {
                ownerserve_bench::classes::run(args).await
            }
            Command::Bench(BenchCommand::Kv(args)) => {
                tokio::task::spawn_blocking(move || ownerserve_bench::kv::run(args)).await?
            }
            Command::Bench(BenchCommand::Planner(args)) => {
                tokio::task::spawn_blocking(move || ownerserve_bench::planner::run(args)).await?
            }
            Command::Bench(BenchCommand::FirstStep(args)) => {
                ownerserve_bench::first_step::run(args).await
            }
            Command::Bench(BenchCommand::Tokenize(args)) => {
                tokio::task::spawn_blocking(move || ownerserve_bench::tokenize::run(args)).await?
            }
            Command::Bench(BenchCommand::Sim(args)) => {
                tokio::task::spawn_blocking(move || ownerserve_bench::sim::run(args)).await?
            }
            Command::Simulate(args) => {
                Ok(
                    tokio::task::spawn_blocking(move || ownerserve_eval::commands::simulate(args))
                        .await??,
                )
            }
            Command::Replay(args) => Ok(ownerserve_eval::commands::replay(args).await?),
            Command::Report(args) => {
                Ok(
                    tokio::task::spawn_blocking(move || ownerserve_eval::commands::report(args))
                        .await??,
                )
            }
        }
    }
}

/// The router's config from its file, environment and flags (logging set up on the way).
fn router_config(args: &RouterArgs, log: Option<LogFormat>) -> anyhow::Result<RouterConfig> {
    let mut file = match &args.config {
        Some(path) => read_toml::<RouterFile>(path)?,
        None => RouterFile::default(),
    };
    logging::init(log.unwrap_or(file.router.log_format));
    file.router.warn_deprecated();
    args.overrides.apply(&mut file.router);
    args.kubernetes.apply(&mut file.kubernetes);
    for flag in &args.workers {
        file.workers.push(parse_worker_flag(flag)?);
    }
    Ok(RouterConfig::validate_with(
        &file.router,
        worker_specs(&file.workers)?,
        &file.kubernetes,
    )?)
}

#[cfg(feature = "kubernetes")]
async fn run_epp(args: EppArgs, log: Option<LogFormat>) -> anyhow::Result<()> {
    let cfg = router_config(&args.router, log)?;
    let listener = bind(cfg.addr).await?;
    let grpc = ownerserve_router::epp::bind(cfg.addr.ip(), &args.epp).await?;
    let shutdown = CancellationToken::new();
    let signals = TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &signals)?;
    cfg.announce_token();
    say(&format!(
        "ownerserve epp: ext_proc on {}, grpc health on {}, operator API on http://{} (policy {}, {} static workers{})",
        grpc.0.local_addr()?,
        grpc.1.local_addr()?,
        listener.local_addr()?,
        cfg.policy,
        cfg.workers.len(),
        if cfg.discovery.is_some() { ", discovering from kubernetes" } else { "" },
    ));
    let served =
        ownerserve_router::epp::run(listener, grpc, cfg, &args.epp, shutdown.clone()).await;
    shutdown.cancel();
    signals.close();
    signals.wait().await;
    served
}

async fn run_router(args: RouterArgs, log: Option<LogFormat>) -> anyhow::Result<()> {
    let cfg = router_config(&args, log)?;
    let listener = bind(cfg.addr).await?;
    let shutdown = CancellationToken::new();
    let signals = TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &signals)?;
    cfg.announce_token();
    say(&format!(
        "ownerserve router listening on http://{} (policy {}, {} workers)",
        listener.local_addr()?,
        cfg.policy,
        cfg.workers.len()
    ));
    let served = server::run(listener, cfg, shutdown.clone()).await;
    shutdown.cancel();
    signals.close();
    signals.wait().await;
    served
}

async fn run_sim_worker(args: SimWorkerArgs) -> anyhow::Result<()> {
    let cfg = args.settings.build()?;
    let listener = bind(SocketAddr::new(args.host, args.port)).await?;
    let publisher = ownerserve_shim::sim::server::bind_publisher(&cfg).await?;
    if let Some(p) = &publisher {
        say(&format!(
            "ownerserve sim worker kv events on {} replay {}",
            p.endpoint,
            p.replay_endpoint.as_deref().unwrap_or("-")
        ));
    }
    let shutdown = CancellationToken::new();
    let signals = TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &signals)?;
    say(&format!(
        "ownerserve sim worker listening on http://{} ({} on {}x {}, {} KV blocks of {} tokens)",
        listener.local_addr()?,
        cfg.served_model_name,
        args.settings.gpus,
        cfg.gpu.name,
        cfg.scheduler.num_blocks,
        cfg.scheduler.block_size
    ));
    let served =
        ownerserve_shim::sim::server::serve(listener, cfg, publisher, shutdown.clone()).await;
    shutdown.cancel();
    signals.close();
    signals.wait().await;
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_runs_on_one_thread_unless_asked_and_up_on_every_core() {
        let threads = |args: &[&str]| {
            let mut argv = vec!["ownerserve"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).unwrap().worker_threads()
        };
        assert_eq!(threads(&["router"]), 1);
        assert_eq!(threads(&["router", "--worker-threads", "3"]), 3);
        assert_eq!(threads(&["up"]), 0);
        assert_eq!(threads(&["up", "--worker-threads", "1"]), 1);
        assert_eq!(threads(&["sim-worker"]), 0);
    }
}
