//! Named workloads as the `simulate`, `report` and `replay` commands select them: the
//! shipped traces (scaled where they are too small) and the generators, with the same
//! defaults everywhere so a simulated and a replayed run see the same requests.

use std::path::{Path, PathBuf};

use crate::workload::{
    agentic, coding_agent, forked, long_doc, mooncake, scale, Arrivals, Loop, Workload,
    WorkloadError,
};

/// Where the repository's traces are (this crate's `traces/` folder).
pub fn default_traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces")
}

/// Which workload to run.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct WorkloadSpec {
    /// `swe-smith` (the SWE-smith agent sessions, scaled to --sessions), `mooncake` (the
    /// Mooncake synthetic trace, open loop), `mooncake-hour` (it tiled to one hour with
    /// fresh content per copy), `coding-agent`, `long-gap` (coding sessions of 30-120K
    /// tokens with tool gaps of seconds to minutes), `repo-swarm` (coding sessions in groups
    /// of 8-32 sharing a 20-60K-token repository), `forked`, `forked-samples`,
    /// `long-doc` (generators), or a path to a Mooncake or agentic JSONL file.
    #[arg(long, default_value = "swe-smith")]
    pub workload: String,
    /// Sessions (scaled traces and generators; default: the trace's own or the
    /// generator's default).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Session arrival rate, per second (Poisson), for scaled traces and generators.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Spread the sessions' arrivals over this many seconds instead (rate = sessions /
    /// window, with --sessions or a capacity search's count): a search over session counts
    /// then raises the load, as for short forked sessions that never pile up at a fixed
    /// rate.
    #[arg(long)]
    pub arrival_window_s: Option<f64>,
    /// Only the first N requests of an open-loop trace (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_requests: usize,
    /// Seed of generators and scaling.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Folder of the shipped traces.
    #[arg(long, default_value_os_t = default_traces_dir())]
    pub traces_dir: PathBuf,
    #[command(flatten)]
    pub knobs: Knobs,
}

/// The generators' knobs beyond sessions and arrivals; unset, each generator's default.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct Knobs {
    /// `repo-swarm`: sessions per group sharing one repository, `MIN-MAX` (8-32).
    #[arg(long, value_parser = token_range)]
    pub group_sessions: Option<(u32, u32)>,
    /// `repo-swarm`: tokens of the repository a group shares, `MIN-MAX` (20480-61440).
    #[arg(long, value_parser = token_range)]
    pub repo_tokens: Option<(u32, u32)>,
    /// `coding-agent`, `long-gap`, `repo-swarm`: each session's own starting context after
    /// the system prompt, tokens, `MIN-MAX` (long-gap: 30720-122880).
    #[arg(long, value_parser = token_range)]
    pub context_tokens: Option<(u32, u32)>,
    /// `forked`, `forked-samples`: branches per root (4).
    #[arg(long)]
    pub branches: Option<u32>,
}

/// A `MIN-MAX` range of positive integers (`MIN` alone: exactly that).
fn token_range(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let parse = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{s}`: expected MIN-MAX, two positive integers"))
    };
    let (lo, hi) = (parse(lo)?, parse(hi)?);
    if lo == 0 || lo > hi {
        return Err(format!("`{s}`: expected 0 < MIN <= MAX"));
    }
    Ok((lo, hi))
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        Self {
            workload: "swe-smith".to_owned(),
            sessions: None,
            rate: 1.0,
            arrival_window_s: None,
            max_requests: 0,
            seed: 1,
            traces_dir: default_traces_dir(),
            knobs: Knobs::default(),
        }
    }
}

/// Tokens of the SWE-smith sessions' common prefix (system prompt and tool schema) kept
/// shared when sessions are scaled: the trace's sessions share their first ~1K tokens.
const SWE_SMITH_SHARED_TOKENS: u32 = 1024;

impl Knobs {
    /// Each session's own starting context, if set.
    fn apply_context(&self, p: &mut coding_agent::CodingAgentParams) {
        if let Some(c) = self.context_tokens {
            p.repo_context_tokens = c;
        }
    }
}

impl WorkloadSpec {
    /// The workload with `n` sessions (a capacity search's count).
    pub fn scaled(&self, n: usize) -> Result<Workload, WorkloadError> {
        WorkloadSpec {
            sessions: Some(n),
            ..self.clone()
        }
        .build()
    }

    /// Builds the workload.
    pub fn build(&self) -> Result<Workload, WorkloadError> {
        let rate = match (self.arrival_window_s, self.sessions) {
            (Some(window), Some(n)) if window > 0.0 => n as f64 / window,
            _ => self.rate,
        };
        let arrivals = Arrivals::Poisson { rate_per_s: rate };
        let mut wl = match self.workload.as_str() {
            "swe-smith" => {
                let base = agentic::read(self.traces_dir.join("continuum_swesmith_derived.jsonl"))?;
                match self.sessions {
                    Some(n) => {
                        let mut w = scale::scale_sessions(
                            &base,
                            n,
                            &arrivals,
                            SWE_SMITH_SHARED_TOKENS,
                            self.seed,
                        );
                        w.name = format!("swe-smith x{n}");
                        w
                    }
                    None => base,
                }
            }
            "mooncake" => mooncake::read(self.traces_dir.join("mooncake_synthetic_trace.jsonl"))?,
            "mooncake-hour" => {
                let base = mooncake::read(self.traces_dir.join("mooncake_synthetic_trace.jsonl"))?;
                tile_open_loop(&base, 3_600_000.0)
            }
            "coding-agent" => {
                let gaps = crate::workload::gaps::swe_smith_gaps(
                    self.traces_dir.join("continuum_swesmith_derived.jsonl"),
                )?;
                let mut p = coding_agent::CodingAgentParams {
                    arrivals,
                    tool_gaps_ms: gaps,
                    ..Default::default()
                };
                if let Some(n) = self.sessions {
                    p.sessions = n;
                }
                self.knobs.apply_context(&mut p);
                coding_agent::generate(&p, self.seed)
            }
            "long-gap" => {
                // Coding sessions of 30-120K-token contexts whose tool calls last seconds
                // to minutes (`workload::gaps::long_gaps`): parked KV competes with the
                // sessions still working.
                let mut p = coding_agent::CodingAgentParams {
                    arrivals,
                    repo_context_tokens: (30 * 1024, 120 * 1024),
                    turns: (8, 16),
                    tool_gaps_ms: crate::workload::gaps::long_gaps(4_096, self.seed),
                    ..Default::default()
                };
                if let Some(n) = self.sessions {
                    p.sessions = n;
                }
                self.knobs.apply_context(&mut p);
                let mut wl = coding_agent::generate(&p, self.seed);
                wl.name = "long_gap".into();
                wl
            }
            "repo-swarm" => {
                // Many agents on one repository: groups of 8-32 sessions share a 20-60K
                // repository context after the system prompt, then each its task and files
                // (2-8K) and its own turns.
                let gaps = crate::workload::gaps::swe_smith_gaps(
                    self.traces_dir.join("continuum_swesmith_derived.jsonl"),
                )?;
                let mut p = coding_agent::CodingAgentParams {
                    sessions: 64,
                    arrivals,
                    repo_context_tokens: (2 * 1024, 8 * 1024),
                    tool_gaps_ms: gaps,
                    shared_repo: Some(coding_agent::SharedRepo {
                        group_sessions: (8, 32),
                        repo_tokens: (20 * 1024, 60 * 1024),
                    }),
                    ..Default::default()
                };
                if let Some(n) = self.sessions {
                    p.sessions = n;
                }
                self.knobs.apply_context(&mut p);
                if let Some(repo) = p.shared_repo.as_mut() {
                    if let Some(g) = self.knobs.group_sessions {
                        repo.group_sessions = g;
                    }
                    if let Some(t) = self.knobs.repo_tokens {
                        repo.repo_tokens = t;
                    }
                }
                let mut wl = coding_agent::generate(&p, self.seed);
                wl.name = "repo_swarm".into();
                wl
            }
            "forked" | "forked-samples" => {
                let mut p = forked::ForkedParams {
                    arrivals,
                    as_samples: self.workload == "forked-samples",
                    ..Default::default()
                };
                if let Some(n) = self.sessions {
                    p.roots = n;
                }
                if let Some(b) = self.knobs.branches {
                    p.branches = b.max(1);
                }
                forked::generate(&p, self.seed)
            }
            "long-doc" => {
                let mut p = long_doc::LongDocParams {
                    arrivals,
                    ..Default::default()
                };
                if let Some(n) = self.sessions {
                    p.sessions = n;
                }
                long_doc::generate(&p, self.seed)
            }
            path => read_file(Path::new(path))?,
        };
        if self.max_requests > 0 {
            truncate(&mut wl, self.max_requests);
        }
        Ok(wl)
    }
}

/// A JSONL trace file: agentic if its first line has a `session_id`, else Mooncake.
fn read_file(path: &Path) -> Result<Workload, WorkloadError> {
    let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io {
        path: path.to_owned(),
        source,
    })?;
    let first = text.lines().next().unwrap_or_default();
    if first.contains("\"session_id\"") {
        agentic::parse(&text, path)
    } else {
        mooncake::parse(&text, path)
    }
}

/// Keeps the first `max` requests in arrival order (open loop) or whole sessions until
/// `max` requests (closed loop), dropping forks whose parent went.
fn truncate(wl: &mut Workload, max: usize) {
    if wl.looping == Loop::Open {
        let mut at: Vec<f64> = wl.steps().filter_map(|(_, s)| s.arrival_ms).collect();
        at.sort_by(f64::total_cmp);
        if let Some(&cutoff) = at.get(max.saturating_sub(1)) {
            for s in &mut wl.sessions {
                s.steps
                    .retain(|st| st.arrival_ms.is_some_and(|a| a <= cutoff));
            }
            wl.sessions.retain(|s| !s.steps.is_empty());
        }
        return;
    }
    let mut left = max;
    let mut keep = 0;
    for s in &mut wl.sessions {
        if left == 0 {
            break;
        }
        s.steps.truncate(left);
        left -= s.steps.len();
        keep += 1;
    }
    wl.sessions.truncate(keep);
    for s in &mut wl.sessions {
        if s.fork_of.is_some_and(|f| f.session >= keep) {
            s.fork_of = None;
        }
    }
    wl.sessions.retain(|s| !s.steps.is_empty());
}

/// Repeats an open-loop trace back to back until `duration_ms`, each copy with its own
/// content (hash ids shifted past the previous copy's) and session names.
pub fn tile_open_loop(base: &Workload, duration_ms: f64) -> Workload {
    let arrivals = || base.steps().filter_map(|(_, s)| s.arrival_ms);
    let span = arrivals().fold(0.0, f64::max);
    let n = base.num_requests().max(1) as f64;
    let period = span + span / n;
    let id_span = base
        .steps()
        .flat_map(|(_, s)| s.hash_ids.iter().copied())
        .max()
        .map_or(1, |m| m + 1);
    let mut out = Workload {
        name: format!("{} tiled to {:.0} s", base.name, duration_ms / 1e3),
        sessions: Vec::new(),
        ..base.clone()
    };
    let mut copy = 0u64;
    while period > 0.0 && copy as f64 * period < duration_ms {
        let offset = copy as f64 * period;
        for s in &base.sessions {
            let mut t = s.clone();
            t.id = format!("{}~{copy}", s.id);
            t.start_ms += offset;
            t.steps.retain_mut(|st| {
                st.arrival_ms = st.arrival_ms.map(|a| a + offset);
                for h in &mut st.hash_ids {
                    *h += copy * id_span;
                }
                st.arrival_ms.is_some_and(|a| a < duration_ms)
            });
            if !t.steps.is_empty() {
                out.sessions.push(t);
            }
        }
        copy += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_workload_builds_and_checks() {
        for name in [
            "swe-smith",
            "mooncake",
            "coding-agent",
            "long-gap",
            "repo-swarm",
            "forked",
            "forked-samples",
            "long-doc",
        ] {
            let spec = WorkloadSpec {
                workload: name.to_owned(),
                sessions: Some(3),
                ..WorkloadSpec::default()
            };
            let wl = spec.build().expect(name);
            wl.check().expect(name);
            assert!(wl.num_requests() > 0, "{name}");
        }
        assert!(WorkloadSpec {
            workload: "no-such-file.jsonl".into(),
            ..WorkloadSpec::default()
        }
        .build()
        .is_err());
    }

    #[test]
    fn the_generators_knobs_shape_what_they_generate() {
        let spec = |knobs: Knobs, workload: &str| WorkloadSpec {
            workload: workload.to_owned(),
            sessions: Some(8),
            knobs,
            ..WorkloadSpec::default()
        };
        let swarm = spec(
            Knobs {
                group_sessions: Some((4, 4)),
                repo_tokens: Some((4_096, 4_096)),
                context_tokens: Some((1_024, 1_024)),
                ..Knobs::default()
            },
            "repo-swarm",
        )
        .build()
        .expect("builds");
        // Two groups of four: a group shares its repository's blocks, the groups do not.
        let first = |s: usize| swarm.sessions[s].steps[0].hash_ids.clone();
        let shared = |a: usize, b: usize| {
            first(a)
                .iter()
                .zip(first(b))
                .take_while(|(x, y)| **x == *y)
                .count()
        };
        assert!(
            shared(0, 3) > shared(0, 4),
            "{} vs {}",
            shared(0, 3),
            shared(0, 4)
        );
        let forks = spec(
            Knobs {
                branches: Some(2),
                ..Knobs::default()
            },
            "forked",
        )
        .build()
        .expect("builds");
        // Eight roots, two branches each.
        assert_eq!(forks.sessions.len(), 8 * 3);
        assert_eq!(token_range("8-32"), Ok((8, 32)));
        assert_eq!(token_range("5"), Ok((5, 5)));
        for bad in ["0-4", "9-3", "a-b", ""] {
            assert!(token_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_hour_of_mooncake_has_distinct_copies() {
        let base = mooncake::read(default_traces_dir().join("mooncake_synthetic_trace.jsonl"))
            .expect("reads");
        let hour = tile_open_loop(&base, 3_600_000.0);
        hour.check().expect("valid");
        let n = hour.num_requests();
        assert!((13_000..15_000).contains(&n), "{n} requests");
        let last = hour
            .steps()
            .filter_map(|(_, s)| s.arrival_ms)
            .fold(0.0, f64::max);
        assert!(last < 3_600_000.0 && last > 3_500_000.0);
        assert!(hour.stats().reuse_ratio < base.stats().reuse_ratio + 0.01);
    }

    #[test]
    fn truncation_keeps_the_earliest_requests() {
        let spec = WorkloadSpec {
            workload: "mooncake".into(),
            max_requests: 100,
            ..WorkloadSpec::default()
        };
        let wl = spec.build().expect("builds");
        assert_eq!(wl.num_requests(), 100);
        wl.check().expect("valid");
    }
}
