//! Simulator throughput: `ownerserve simulate` on 10,000 agent requests and on an hour of
//! Mooncake-format traffic over 8 GPUs, each with the ownerserve policy and, as the
//! baseline in the same run, round robin (the cheapest policy to evaluate).

use std::time::Instant;

use ownerserve_eval::report::make_policy;
use ownerserve_eval::scenario::WorkloadSpec;
use ownerserve_eval::sim::{simulate, Cluster, SimOptions};
use ownerserve_shim::sim::config::SimSettings;

use ownerserve_eval::console::say;

/// Sizes of the simulator benchmark.
#[derive(Debug, clap::Args)]
pub struct SimBenchArgs {
    /// SWE-smith sessions for the first workload (25 requests each on average).
    #[arg(long, default_value_t = 400)]
    sessions: usize,
    /// Cluster for both workloads.
    #[arg(long, default_value = "8h")]
    cluster: String,
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: SimBenchArgs) -> anyhow::Result<()> {
    let cluster = Cluster::parse(&args.cluster, &SimSettings::default())?;
    let workloads = [
        WorkloadSpec {
            workload: "swe-smith".to_owned(),
            sessions: Some(args.sessions),
            rate: 2.0,
            ..WorkloadSpec::default()
        },
        WorkloadSpec {
            workload: "mooncake-hour".to_owned(),
            ..WorkloadSpec::default()
        },
    ];
    say(&format!(
        "`ownerserve simulate` throughput on {} (one core, release build)\n",
        cluster.name
    ));
    say("| workload | requests | policy | wall s | requests/s | virtual s | vs round_robin | target |");
    say("|---|---:|---|---:|---:|---:|---:|---|");
    for (spec, target) in workloads.iter().zip(["< 60 s", "< 120 s"]) {
        let t = Instant::now();
        let wl = spec.build()?;
        let load_s = t.elapsed().as_secs_f64();
        let mut baseline = None;
        for name in ["round_robin", "ownerserve"] {
            let policy = make_policy(name, &wl, &cluster)?;
            let t = Instant::now();
            let r = simulate(&wl, &cluster, policy, &SimOptions::default(), &|_| {})?;
            let wall = t.elapsed().as_secs_f64() + load_s;
            let rate = r.steps.len() as f64 / wall;
            let base = *baseline.get_or_insert(rate);
            say(&format!(
                "| {} | {} | {name} | {wall:.1} | {rate:.0} | {:.0} | {:.2}x | {target} |",
                wl.name,
                r.steps.len(),
                r.makespan_s,
                rate / base,
            ));
        }
    }
    Ok(())
}
