//! `bench directory --scale`'s output: what each point holds ([`Point`]), the table of
//! every point (one column per session count, the targets and their verdicts at the
//! largest) and the PNG curves.

use std::path::Path;

use ownerserve_eval::console::say;
use ownerserve_eval::plot::{lines_png, Series};

use super::dir_live::{CatchUp, Recovery, Writes, MISSED_ENTRIES};
use super::dir_snapshot::SnapshotFigures;
use super::percentile;

/// The target of a new replica's catch-up at a million sessions (issue 65), in seconds.
pub const CATCH_UP_TARGET_S: f64 = 5.0;
/// The state machine's memory target: 1 GB per million sessions.
pub const MEMORY_TARGET_B: f64 = 1_000.0;
/// The batched write target (claims/s, p99 ms per batch), as in the default run.
pub const WRITE_TARGET: (f64, f64) = (10_000.0, 10.0);

/// One cluster's figures at one session count.
#[derive(Default)]
pub struct Live {
    pub batched: Option<Writes>,
    pub one: Option<Writes>,
    pub rss_max: u64,
    /// `None`: not measured on this cluster; an error: it did not catch up.
    pub catch_up: Option<Result<CatchUp, String>>,
    pub recovery: Option<Result<Recovery, String>>,
    /// A follower down past the leader's log, sent its snapshot.
    pub installed: Option<Result<Recovery, String>>,
}

/// Everything measured at one session count.
pub struct Point {
    pub n: usize,
    pub memory_b: f64,
    pub snapshot: SnapshotFigures,
    /// Per cluster size, in the order they were run.
    pub live: Vec<Live>,
}

/// `n` as the table heads it: `100K`, `1M`.
pub fn short(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}K", n / 1_000),
        n => n.to_string(),
    }
}

/// Bytes in MB.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Prints one row: the measurement, a cell per session count, the target and its verdict.
fn row(name: &str, cells: impl Iterator<Item = String>, target: &str) {
    say(&format!(
        "| {name} | {} | {target} |",
        cells.collect::<Vec<_>>().join(" | ")
    ));
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// Prints the table: a column per session count, the targets judged at the largest; `nodes`
/// are the cluster sizes run, `tail_rate` the claims/s during catch-ups.
pub fn table(points: &[Point], nodes: &[usize], tail_rate: u64) {
    let Some(last) = points.last() else {
        return;
    };
    let at = short(last.n);
    say("");
    say(&format!(
        "| measurement | {} | target (at {at}) |",
        points
            .iter()
            .map(|p| short(p.n))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    say(&format!("|---|{}---|", "---:|".repeat(points.len())));
    row(
        "state machine in process: resident bytes per session",
        points.iter().map(|p| format!("{:.0} B", p.memory_b)),
        &format!(
            "≤ 1 GB per 1M: {}",
            verdict(last.memory_b <= MEMORY_TARGET_B)
        ),
    );
    row(
        &format!(
            "largest of {} node processes: resident MB (bytes per session)",
            nodes.first().copied().unwrap_or(0)
        ),
        points.iter().map(|p| {
            let rss = p.live.first().map_or(0, |l| l.rss_max);
            format!("{:.0} ({:.0} B)", mb(rss), rss as f64 / p.n as f64)
        }),
        "",
    );
    let snap = |f: fn(&SnapshotFigures) -> String| points.iter().map(move |p| f(&p.snapshot));
    row(
        "state JSON: MB (a replica's snapshot line)",
        snap(|s| format!("{:.0}", mb(s.state_bytes))),
        "",
    );
    row(
        "snapshot file: MB, × the JSON",
        snap(|s| {
            format!(
                "{:.0} ({:.1}×)",
                mb(s.file_bytes),
                s.file_bytes as f64 / s.state_bytes.max(1) as f64
            )
        }),
        "",
    );
    row(
        "floor: serde_json encode, s",
        snap(|s| format!("{:.2}", s.encode_s)),
        "",
    );
    row(
        "snapshot build (encode, file, fsync), s (× floor)",
        snap(|s| format!("{:.2} ({:.1}×)", s.build_s, s.build_s / s.encode_s)),
        "",
    );
    row(
        "longest apply of an entry during the build, ms",
        snap(|s| format!("{:.1}", s.apply_wait_s * 1e3)),
        "",
    );
    row(
        "floor: serde_json decode, s",
        snap(|s| format!("{:.2}", s.decode_s)),
        "",
    );
    row(
        "snapshot install, s (× floor)",
        snap(|s| format!("{:.2} ({:.1}×)", s.install_s, s.install_s / s.decode_s)),
        "",
    );
    row(
        "snapshot load at start, s (× floor)",
        snap(|s| format!("{:.2} ({:.1}×)", s.load_s, s.load_s / s.decode_s)),
        "",
    );
    let caught = |p: &Point| p.live.first().and_then(|l| l.catch_up.clone());
    row(
        &format!(
            "new replica, {} claims/s meanwhile: snapshot applied, s",
            tail_rate
        ),
        points
            .iter()
            .map(|p| cell(caught(p), |c| format!("{:.2}", c.synced_s))),
        "",
    );
    let last_catch_up = match caught(last) {
        Some(Ok(c)) => c.caught_up_s,
        _ => f64::INFINITY,
    };
    row(
        "new replica: caught up (snapshot + tail), s (tail entries)",
        points.iter().map(|p| {
            cell(caught(p), |c| {
                format!("{:.2} ({})", c.caught_up_s, c.tail_entries)
            })
        }),
        &if last.n < 1_000_000 {
            "≤ 5 s at 1M: 1M not run".to_owned()
        } else {
            format!(
                "≤ 5 s at 1M: {}",
                verdict(last_catch_up <= CATCH_UP_TARGET_S)
            )
        },
    );
    let rec = |p: &Point| p.live.first().and_then(|l| l.recovery.clone());
    row(
        &format!("follower after kill -9, down for {MISSED_ENTRIES} entries: listening (snapshot + log loaded), s"),
        points.iter().map(|p| cell(rec(p), |r| format!("{:.2}", r.listening_s))),
        "",
    );
    row(
        "follower after kill -9: caught up with the leader, s",
        points
            .iter()
            .map(|p| cell(rec(p), |r| format!("{:.2}", r.caught_up_s))),
        "",
    );
    let installed = |p: &Point| p.live.first().and_then(|l| l.installed.clone());
    row(
        "follower down past the leader's log: caught up via InstallSnapshot, s",
        points
            .iter()
            .map(|p| cell(installed(p), |r| format!("{:.2}", r.caught_up_s))),
        "",
    );
    for (k, nodes) in nodes.iter().enumerate() {
        let writes = |p: &Point, batched: bool| writes_of(p, k, batched).cloned();
        let (rate, p99) = writes(last, true).map_or((0.0, f64::INFINITY), |w| {
            (w.rate, percentile(&w.latencies_ms, 99.0))
        });
        row(
            &format!("{nodes} nodes: claims/s in batches of 128 while filling (p99 ms per batch)"),
            points.iter().map(|p| {
                writes(p, true).map_or_else(
                    || "–".to_owned(),
                    |w| format!("{:.0} ({:.1})", w.rate, percentile(&w.latencies_ms, 99.0)),
                )
            }),
            &format!(
                "≥ 10,000/s, p99 ≤ 10 ms: {}",
                verdict(rate >= WRITE_TARGET.0 && p99 <= WRITE_TARGET.1)
            ),
        );
        row(
            &format!("{nodes} nodes: baseline, 1 claim in flight: claims/s (p99 ms)"),
            points.iter().map(|p| {
                writes(p, false).map_or_else(
                    || "–".to_owned(),
                    |w| format!("{:.0} ({:.2})", w.rate, percentile(&w.latencies_ms, 99.0)),
                )
            }),
            "",
        );
    }
}

/// A table cell: `–` when not measured, `failed` when it did not catch up.
fn cell<T>(measured: Option<Result<T, String>>, f: impl Fn(T) -> String) -> String {
    match measured {
        None => "–".to_owned(),
        Some(Err(_)) => "failed".to_owned(),
        Some(Ok(v)) => f(v),
    }
}

/// A figure of a measured point, for the plots (NaN: not measured or failed).
fn figure<T>(measured: Option<&Result<T, String>>, f: impl Fn(&T) -> f64) -> Option<f64> {
    measured?.as_ref().ok().map(f)
}

/// Cluster `k`'s batched or one-at-a-time writes at `p`.
fn writes_of(p: &Point, k: usize, batched: bool) -> Option<&Writes> {
    let l = p.live.get(k)?;
    if batched {
        l.batched.as_ref()
    } else {
        l.one.as_ref()
    }
}

/// Draws the curves into `dir`: times, write rates and bytes per session.
pub fn plots(points: &[Point], nodes: &[usize], dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let x = |p: &Point| p.n as f64 / 1e3;
    let curve = |f: &dyn Fn(&Point) -> Option<f64>| -> Vec<(f64, f64)> {
        points
            .iter()
            .map(|p| (x(p), f(p).unwrap_or(f64::NAN)))
            .collect()
    };
    let times = [
        (
            "snapshot encode (serde_json floor)",
            curve(&|p| Some(p.snapshot.encode_s)),
        ),
        (
            "snapshot build (node)",
            curve(&|p| Some(p.snapshot.build_s)),
        ),
        (
            "snapshot load at start (node)",
            curve(&|p| Some(p.snapshot.load_s)),
        ),
        (
            "new replica caught up",
            curve(&|p| figure(p.live.first()?.catch_up.as_ref(), |c| c.caught_up_s)),
        ),
        (
            "follower after kill -9 caught up",
            curve(&|p| figure(p.live.first()?.recovery.as_ref(), |r| r.caught_up_s)),
        ),
        (
            "follower sent the leader's snapshot caught up",
            curve(&|p| figure(p.live.first()?.installed.as_ref(), |r| r.caught_up_s)),
        ),
        (
            "target: replica ≤ 5 s at 1M",
            curve(&|_| Some(CATCH_UP_TARGET_S)),
        ),
    ];
    let series: Vec<Series<'_>> = times
        .iter()
        .map(|(label, points)| Series { label, points })
        .collect();
    lines_png(
        &dir.join("directory-scale-times.png"),
        "Directory: snapshot and catch-up time vs sessions",
        "sessions (thousands)",
        "seconds",
        &series,
    )?;
    let mut rates = Vec::new();
    for (k, n) in nodes.iter().enumerate() {
        let w = |batched: bool| curve(&|p| writes_of(p, k, batched).map(|w| w.rate));
        rates.push((format!("{n} nodes, batches of 128"), w(true)));
        rates.push((format!("{n} nodes, 1 in flight"), w(false)));
    }
    let series: Vec<Series<'_>> = rates
        .iter()
        .map(|(label, points)| Series { label, points })
        .collect();
    lines_png(
        &dir.join("directory-scale-writes.png"),
        "Directory: claims committed per second vs sessions held",
        "sessions (thousands)",
        "claims/s",
        &series,
    )?;
    let memory = [
        ("state machine (in process)", curve(&|p| Some(p.memory_b))),
        (
            "largest node process",
            curve(&|p| Some(p.live.first()?.rss_max as f64 / p.n as f64)),
        ),
        (
            "state JSON",
            curve(&|p| Some(p.snapshot.state_bytes as f64 / p.n as f64)),
        ),
        (
            "snapshot file",
            curve(&|p| Some(p.snapshot.file_bytes as f64 / p.n as f64)),
        ),
    ];
    let series: Vec<Series<'_>> = memory
        .iter()
        .map(|(label, points)| Series { label, points })
        .collect();
    lines_png(
        &dir.join("directory-scale-bytes.png"),
        "Directory: bytes per session",
        "sessions (thousands)",
        "bytes per session",
        &series,
    )?;
    say(&format!(
        "plots: {}/directory-scale-{{times,writes,bytes}}.png",
        dir.display()
    ));
    Ok(())
}
