//! The soak's figures, computed from what was recorded (pure, so tested alone): a row
//! per minute and the verdict against issue 66's acceptance.
//!
//! Definitions: minute `m` is seconds `[60(m-1), 60m)` of the run. A process's memory or
//! descriptors "at minute m" is the median of its samples in that minute. The baseline
//! minute is the acceptance's minute 10 of an hour, scaled to shorter runs (minute 1 of 5;
//! [`baseline_minute`]); a process restarted after that minute began cannot show growth
//! since then and is not judged, and a directory node that became or stopped being the
//! leader since then has its descriptors judged from its first whole minute in the role it
//! ended in. Only OwnerServe's own processes (routers, directory
//! nodes) are judged; the simulated workers stand in for engines and are shown. p99 TTFT
//! drift compares the streams of a window of minutes from the baseline (10 minutes, or
//! half of what is left) with the same span at the end, leaving out the streams sent
//! while a fault was on (from its injection until its victim was healthy again, plus
//! [`SETTLE_S`]): drift is what time does, a fault's outage is judged by its recovery.

use std::collections::{BTreeMap, BTreeSet};

use super::directory::Audit;
use super::faults::Fault;
use super::sample::ProcSample;
use super::topology::Part;
use super::traffic::{Api, Outcome, Request};
use crate::percentile;

/// The limits the verdict holds the run to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most growth of memory and descriptors over the baseline, as a fraction.
    pub growth: f64,
    /// Most growth of p99 TTFT over the baseline window, as a fraction.
    pub drift: f64,
    /// Longest a fault may take to recover, seconds.
    pub recover_s: f64,
}

/// One state read's findings, with when it was taken.
#[derive(Debug, Clone, Default)]
pub struct Check {
    pub at_s: f64,
    /// `None`: the state could not be read.
    pub audit: Option<Audit>,
    /// The directory node that was leader (its `Part::Node` index), if one was named.
    pub leader: Option<usize>,
}

/// Everything recorded in a run.
pub struct Run<'a> {
    pub minutes: usize,
    pub baseline: usize,
    pub requests: &'a [Request],
    pub samples: &'a [ProcSample],
    pub checks: &'a [Check],
    pub faults: &'a [Fault],
    /// Part → seconds of each restart.
    pub restarts: &'a BTreeMap<Part, Vec<f64>>,
    pub names: &'a BTreeMap<Part, String>,
    pub ledger_writes: u64,
    /// Sessions whose answers named an epoch (each checked against the directory).
    pub sessions_with_epochs: usize,
}

/// Seconds after a fault's recovery whose streams still count as under it.
pub const SETTLE_S: f64 = 5.0;

/// The minute memory, descriptors and latency are compared with: the acceptance's minute
/// 10 of 60, at the same share of a shorter run (at least minute 1), never past 10.
pub fn baseline_minute(minutes: usize) -> usize {
    ((minutes as f64 / 6.0).round() as usize).clamp(1, 10)
}

fn minute_of(at_s: f64) -> usize {
    (at_s / 60.0) as usize + 1
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The TTFTs (ms) of streams sent in minutes `from..=to`, sorted, leaving out those sent
/// while one of `faults` was on.
fn ttfts(requests: &[Request], from: usize, to: usize, faults: &[Fault]) -> Vec<f64> {
    let under_fault = |at_s: f64| {
        faults
            .iter()
            .any(|f| at_s >= f.at_s && at_s < f.healthy_at_s + SETTLE_S)
    };
    let mut v: Vec<f64> = requests
        .iter()
        .filter(|r| r.api == Api::Stream && (from..=to).contains(&minute_of(r.at_s)))
        .filter(|r| !under_fault(r.at_s))
        .filter_map(|r| r.ttft_ms)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

impl Run<'_> {
    /// A part's median of `f` over minute `m`.
    fn at_minute(&self, part: Part, m: usize, f: fn(&ProcSample) -> Option<f64>) -> Option<f64> {
        median(
            self.samples
                .iter()
                .filter(|s| s.part == part && minute_of(s.at_s) == m)
                .filter_map(f)
                .collect(),
        )
    }

    fn cells(&self, parts: &[Part], m: usize, f: fn(&ProcSample) -> Option<f64>) -> String {
        let vals: Vec<String> = parts
            .iter()
            .map(|&p| match self.at_minute(p, m, f) {
                Some(v) => format!("{v:.0}"),
                None => "–".to_owned(),
            })
            .collect();
        vals.join(" / ")
    }

    /// When directory node `part` last became or stopped being the leader, as the state
    /// reads saw it (reads that named no leader skipped); `None` for other parts.
    fn role_changed_at(&self, part: Part) -> Option<f64> {
        if !matches!(part, Part::Node(_)) {
            return None;
        }
        let mut last = None;
        let mut changed = None;
        for c in self.checks {
            let Some(leader) = c.leader else { continue };
            let leads = Part::Node(leader) == part;
            if last.is_some_and(|l| l != leads) {
                changed = Some(c.at_s);
            }
            last = Some(leads);
        }
        changed
    }

    /// The minute a part's descriptors are judged from: the baseline, or for a directory node
    /// whose role changed since then, its first whole minute in the role it ended in (a
    /// leader holds a connection to each follower and router: more descriptors, not a
    /// leak). `None`: the role changed in the last minute, so nothing is left to judge.
    fn judged_from(&self, part: Part) -> Option<usize> {
        let since = (self.baseline as f64 - 1.0) * 60.0;
        match self.role_changed_at(part) {
            Some(t) if t >= since => Some(minute_of(t) + 1).filter(|&m| m < self.minutes),
            _ => Some(self.baseline),
        }
    }

    fn of(&self, pred: fn(&Part) -> bool) -> Vec<Part> {
        self.names.keys().copied().filter(pred).collect()
    }

    /// The per-minute table (Markdown).
    pub fn table(&self) -> Vec<String> {
        let routers = self.of(|p| matches!(p, Part::Router(_)));
        let nodes = self.of(|p| matches!(p, Part::Node(_)));
        let workers = self.of(|p| matches!(p, Part::Worker(_)));
        let rss = |s: &ProcSample| Some(s.rss_kb as f64 / 1024.0);
        let fds = |s: &ProcSample| Some(s.fds as f64);
        let tasks = |s: &ProcSample| s.tasks.map(|t| t as f64);
        let heap = |s: &ProcSample| s.heap_kb.map(|k| k as f64 / 1024.0);
        let mut out = vec![
            "| minute | requests | errors | TTFT p50 / p99 ms | RSS MB routers a / b | live heap MB routers a / b | RSS MB nodes 1 / 2 / 3 | live heap MB nodes 1 / 2 / 3 | RSS MB workers | fds routers a / b | fds nodes 1 / 2 / 3 | tasks routers a / b | tasks nodes 1 / 2 / 3 | directory sessions | violations / lost | faults |".to_owned(),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|".to_owned(),
        ];
        for m in 1..=self.minutes {
            let reqs: Vec<&Request> = self
                .requests
                .iter()
                .filter(|r| minute_of(r.at_s) == m)
                .collect();
            let errors = reqs.iter().filter(|r| is_error(&r.outcome)).count();
            let t = ttfts(self.requests, m, m, &[]);
            let audits: Vec<&super::directory::Audit> = self
                .checks
                .iter()
                .filter(|c| minute_of(c.at_s) == m)
                .filter_map(|c| c.audit.as_ref())
                .collect();
            let sessions = audits
                .last()
                .map_or("–".to_owned(), |a| a.sessions.to_string());
            let violations: usize = audits.iter().map(|a| a.violations.len()).sum();
            let lost: usize = audits
                .iter()
                .map(|a| a.ledger_lost.len() + a.sessions_lost.len())
                .sum::<usize>()
                + reqs
                    .iter()
                    .filter(|r| matches!(r.outcome, Outcome::ResponseLost(_)))
                    .count();
            let faults: Vec<String> = self
                .faults
                .iter()
                .filter(|f| minute_of(f.at_s) == m)
                .map(|f| format!("{} {}", f.kind.verb(), f.victim))
                .collect();
            out.push(format!(
                "| {m} | {} | {errors} | {:.0} / {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {sessions} | {violations} / {lost} | {} |",
                reqs.len(),
                percentile(&t, 50.0),
                percentile(&t, 99.0),
                self.cells(&routers, m, rss),
                self.cells(&routers, m, heap),
                self.cells(&nodes, m, rss),
                self.cells(&nodes, m, heap),
                self.cells(&workers, m, rss),
                self.cells(&routers, m, fds),
                self.cells(&nodes, m, fds),
                self.cells(&routers, m, tasks),
                self.cells(&nodes, m, tasks),
                faults.join(", "),
            ));
        }
        out
    }

    /// The baseline and final windows of the TTFT drift: (from, to) minutes each.
    pub fn windows(&self) -> ((usize, usize), (usize, usize)) {
        let left = self.minutes.saturating_sub(self.baseline) + 1;
        let w = (left / 2).clamp(1, 10);
        (
            (self.baseline, self.baseline + w - 1),
            (self.minutes + 1 - w, self.minutes),
        )
    }

    /// The verdict's lines and whether every criterion holds; with `safety_only`, memory,
    /// descriptors and drift are shown but do not count.
    pub fn verdict(&self, limits: Limits, safety_only: bool) -> (Vec<String>, bool) {
        let shown = if safety_only {
            " (shown, not gating)"
        } else {
            ""
        };
        let mut lines = Vec::new();
        let mut pass = true;
        let b = self.baseline;
        let since = (b as f64 - 1.0) * 60.0;
        let scaled = match b != 10 && b == baseline_minute(self.minutes) {
            true => format!(
                " (the acceptance's minute 10 of 60, scaled to this {}-minute run)",
                self.minutes
            ),
            false => String::new(),
        };
        for (what, f) in [
            (
                "RSS",
                (|s: &ProcSample| Some(s.rss_kb as f64 / 1024.0)) as fn(&ProcSample) -> Option<f64>,
            ),
            ("fds", |s: &ProcSample| Some(s.fds as f64)),
        ] {
            let mut judged = Vec::new();
            let mut skipped = Vec::new();
            let mut ok = true;
            for (&part, name) in self.names {
                if matches!(part, Part::Worker(_)) {
                    continue;
                }
                let restarted = self
                    .restarts
                    .get(&part)
                    .is_some_and(|r| r.iter().any(|&t| t >= since));
                // Descriptors follow a node's role; memory is judged from the baseline.
                let from = match what {
                    "fds" => self.judged_from(part),
                    _ => Some(b),
                };
                let Some(from) = from.filter(|_| !restarted) else {
                    skipped.push(name.clone());
                    continue;
                };
                let (Some(base), Some(last)) = (
                    self.at_minute(part, from, f),
                    self.at_minute(part, self.minutes, f),
                ) else {
                    ok = false;
                    judged.push(format!("{name} unsampled"));
                    continue;
                };
                let growth = last / base - 1.0;
                ok &= growth <= limits.growth;
                let role = match from == b {
                    true => String::new(),
                    false => format!(" from minute {from}, its role's first"),
                };
                judged.push(format!(
                    "{name}{role} {base:.1} → {last:.1} ({:+.1}%)",
                    growth * 100.0
                ));
            }
            pass &= ok || safety_only;
            lines.push(format!(
                "- {what} within +{:.0}% of minute {b}{scaled}: {}{shown} — {}{}",
                limits.growth * 100.0,
                mark(ok),
                judged.join("; "),
                match skipped.is_empty() {
                    true => String::new(),
                    false => format!(
                        " (restarted, or changed role in the last minute, since: not judged: {})",
                        skipped.join(", ")
                    ),
                }
            ));
        }
        let (lost, violations, unread) = self.safety();
        let most = |f: fn(&Audit) -> usize| {
            self.checks
                .iter()
                .filter_map(|c| c.audit.as_ref())
                .map(f)
                .max()
                .unwrap_or(0)
        };
        let (ended, closed, retired) = (
            most(|a| a.sessions_ended),
            most(|a| a.sessions_closed),
            most(|a| a.sessions_retired),
        );
        // A read may fail during an election; the last one, once healed, may not.
        let last_read = self.checks.last().is_some_and(|c| c.audit.is_some());
        pass &= lost.is_empty() && violations.is_empty() && last_read;
        lines.push(format!(
            "- lost acknowledged writes: {} — {} ({} ledger writes; {} sessions' epochs, {ended} ended with a killed worker's lease, {closed} ended by their clients' close, {retired} by the retention sweep; {} Responses turns){}",
            mark(lost.is_empty()),
            lost.len(),
            self.ledger_writes,
            self.sessions_with_epochs,
            self.requests.iter().filter(|r| r.api == Api::Responses).count(),
            first_few(&lost)
        ));
        lines.push(format!(
            "- invariant violations: {} — {} in {} state reads ({unread} unreadable during faults){}",
            mark(violations.is_empty() && last_read),
            violations.len(),
            self.checks.len(),
            first_few(&violations)
        ));
        let ((f0, f1), (l0, l1)) = self.windows();
        let (base, last) = (
            percentile(&ttfts(self.requests, f0, f1, self.faults), 99.0),
            percentile(&ttfts(self.requests, l0, l1, self.faults), 99.0),
        );
        let drift = last / base - 1.0;
        let ok = drift <= limits.drift;
        pass &= ok || safety_only;
        lines.push(format!(
            "- p99 TTFT drift ≤ {:.0}%: {}{shown} — minutes {f0}–{f1} {base:.0} ms → minutes {l0}–{l1} {last:.0} ms ({:+.1}%; streams sent while a fault was on left out)",
            limits.drift * 100.0,
            mark(ok),
            drift * 100.0
        ));
        let slow: Vec<&Fault> = self
            .faults
            .iter()
            .filter(|f| f.recovered_s.is_none_or(|s| s > limits.recover_s))
            .collect();
        let worst = self
            .faults
            .iter()
            .filter_map(|f| f.recovered_s)
            .fold(0.0, f64::max);
        pass &= slow.is_empty() && !self.faults.is_empty();
        lines.push(format!(
            "- every fault recovered within {:.0} s: {} — {} faults, {} late, slowest {worst:.1} s",
            limits.recover_s,
            mark(slow.is_empty() && !self.faults.is_empty()),
            self.faults.len(),
            slow.len()
        ));
        (lines, pass)
    }

    /// Distinct lost writes and violations over every read, and the reads that failed.
    fn safety(&self) -> (BTreeSet<String>, BTreeSet<String>, usize) {
        let mut lost = BTreeSet::new();
        let mut violations = BTreeSet::new();
        let mut unread = 0;
        for c in self.checks {
            match &c.audit {
                Some(a) => {
                    lost.extend(a.ledger_lost.iter().cloned());
                    lost.extend(a.sessions_lost.iter().cloned());
                    violations.extend(a.violations.iter().cloned());
                }
                None => unread += 1,
            }
        }
        for r in self.requests {
            if let Outcome::ResponseLost(what) = &r.outcome {
                lost.insert(format!("response {what}"));
            }
        }
        (lost, violations, unread)
    }
}

fn is_error(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Status(_) | Outcome::Broken | Outcome::ResponseLost(_)
    )
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "**pass**"
    } else {
        "**FAIL**"
    }
}

fn first_few(items: &BTreeSet<String>) -> String {
    if items.is_empty() {
        return String::new();
    }
    let few: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
    format!(": {}", few.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::faults::Kind;

    fn sample(at_s: f64, part: Part, rss_mb: u64, fds: u64) -> ProcSample {
        ProcSample {
            at_s,
            part,
            rss_kb: rss_mb * 1024,
            fds,
            threads: 4,
            tasks: Some(10),
            heap_kb: Some(rss_mb.saturating_sub(10) * 1024),
        }
    }

    fn stream(at_s: f64, ttft_ms: f64) -> Request {
        Request {
            at_s,
            api: Api::Stream,
            outcome: Outcome::Ok,
            ttft_ms: Some(ttft_ms),
            ms: ttft_ms,
        }
    }

    #[test]
    fn the_verdict_judges_growth_of_unrestarted_servers_drift_and_recovery() {
        let names = BTreeMap::from([
            (Part::Node(0), "node-1".to_owned()),
            (Part::Router(0), "router-a".to_owned()),
            (Part::Router(1), "router-b".to_owned()),
            (Part::Worker(0), "decode-0".to_owned()),
        ]);
        let samples = [
            sample(10.0, Part::Router(0), 100, 40),
            sample(70.0, Part::Router(0), 105, 41),
            sample(10.0, Part::Node(0), 30, 20),
            sample(70.0, Part::Node(0), 40, 20),
            sample(10.0, Part::Router(1), 100, 40),
            sample(70.0, Part::Router(1), 200, 90),
            sample(10.0, Part::Worker(0), 30, 20),
            sample(70.0, Part::Worker(0), 300, 20),
        ];
        // The 5 s stream was sent while router-b was down: left out of the drift.
        let requests = [
            stream(5.0, 100.0),
            stream(40.0, 5000.0),
            stream(65.0, 110.0),
        ];
        let restarts = BTreeMap::from([(Part::Router(1), vec![30.0])]);
        let faults = [Fault {
            at_s: 30.0,
            kind: Kind::KillRouter,
            victim: "router-b".into(),
            recovered_s: Some(2.0),
            healthy_at_s: 37.0,
        }];
        let checks = [Check {
            at_s: 80.0,
            audit: Some(Default::default()),
            leader: Some(0),
        }];
        let run = Run {
            minutes: 2,
            baseline: 1,
            requests: &requests,
            samples: &samples,
            checks: &checks,
            faults: &faults,
            restarts: &restarts,
            names: &names,
            ledger_writes: 5,
            sessions_with_epochs: 1,
        };
        let limits = Limits {
            growth: 0.1,
            drift: 0.2,
            recover_s: 30.0,
        };
        let (lines, pass) = run.verdict(limits, false);
        assert!(!pass, "node-1 grew 33%");
        let (safety, pass_safety) = run.verdict(limits, true);
        assert!(pass_safety, "{safety:?}");
        assert!(
            safety[0].contains("**FAIL** (shown, not gating)"),
            "{}",
            safety[0]
        );
        assert!(
            lines[0].starts_with(
                "- RSS within +10% of minute 1 (the acceptance's minute 10 of 60, scaled to this 2-minute run): **FAIL**"
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("node-1 30.0 → 40.0 (+33.3%)"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("not judged: router-b"), "{}", lines[0]);
        assert!(
            !lines[0].contains("decode-0"),
            "workers are shown, not judged"
        );
        assert!(lines[1].contains("2-minute run): **pass**"), "{}", lines[1]);
        assert!(
            lines[2].contains("lost acknowledged writes: **pass** — 0"),
            "{}",
            lines[2]
        );
        assert!(
            lines[4].contains("100 ms → minutes 2–2 110 ms (+10.0%;"),
            "{}",
            lines[4]
        );
        assert!(
            lines[5].contains("**pass** — 1 faults, 0 late, slowest 2.0 s"),
            "{}",
            lines[5]
        );
        let table = run.table();
        assert_eq!(table.len(), 4);
        assert!(
            table[3].starts_with("| 2 | 1 | 0 | 110 / 110 | 105 / 200 | 95 / 190 | 40 |"),
            "{}",
            table[3]
        );
    }

    #[test]
    fn a_node_that_took_or_lost_the_lead_is_judged_from_its_first_minute_in_that_role() {
        let names = BTreeMap::from([
            (Part::Node(0), "node-1".to_owned()),
            (Part::Node(1), "node-2".to_owned()),
            (Part::Node(2), "node-3".to_owned()),
        ]);
        // node-2 leads from 150 s (minute 3) with 10 more descriptors, then holds them;
        // node-1 gives up the lead then with 5 fewer; node-3 keeps its role and leaks.
        let mut samples = Vec::new();
        for m in 0u32..6 {
            let at_s = 60.0 * f64::from(m) + 30.0;
            let (before, after) = (m < 2, m >= 2);
            samples.push(sample(
                at_s,
                Part::Node(0),
                30,
                if before { 25 } else { 20 },
            ));
            samples.push(sample(at_s, Part::Node(1), 30, if after { 25 } else { 15 }));
            samples.push(sample(at_s, Part::Node(2), 30, 15 + 2 * u64::from(m)));
        }
        let check = |at_s, leader: Option<usize>| Check {
            at_s,
            audit: Some(Default::default()),
            leader,
        };
        let mut checks = vec![
            check(30.0, Some(0)),
            check(140.0, None),
            check(150.0, Some(1)),
            check(330.0, Some(1)),
        ];
        let fds = |checks: &[Check]| {
            let run = Run {
                minutes: 6,
                baseline: 1,
                requests: &[],
                samples: &samples,
                checks,
                faults: &[],
                restarts: &BTreeMap::new(),
                names: &names,
                ledger_writes: 0,
                sessions_with_epochs: 0,
            };
            let limits = Limits {
                growth: 0.1,
                drift: 0.2,
                recover_s: 30.0,
            };
            run.verdict(limits, false).0[1].clone()
        };
        let line = fds(&checks);
        assert!(line.contains("**FAIL**"), "node-3 leaks: {line}");
        for judged in [
            "node-1 from minute 4, its role's first 20.0 → 20.0 (+0.0%)",
            "node-2 from minute 4, its role's first 25.0 → 25.0 (+0.0%)",
            "node-3 15.0 → 25.0 (+66.7%)",
        ] {
            assert!(line.contains(judged), "{judged}: {line}");
        }
        // A lead taken in the last minute leaves nothing to judge of either node.
        checks.push(check(310.0, Some(2)));
        checks.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let line = fds(&checks);
        assert!(line.contains("not judged: node-2, node-3"), "{line}");
    }

    #[test]
    fn the_baseline_is_minute_10_of_an_hour_scaled_down_and_never_later() {
        assert_eq!(baseline_minute(60), 10);
        assert_eq!(baseline_minute(120), 10);
        assert_eq!(baseline_minute(30), 5);
        assert_eq!(baseline_minute(5), 1);
        assert_eq!(baseline_minute(1), 1);
    }

    #[test]
    fn drift_windows_are_ten_minutes_in_an_hour_and_one_in_five() {
        let run = |minutes, baseline| {
            Run {
                minutes,
                baseline,
                requests: &[],
                samples: &[],
                checks: &[],
                faults: &[],
                restarts: &BTreeMap::new(),
                names: &BTreeMap::new(),
                ledger_writes: 0,
                sessions_with_epochs: 0,
            }
            .windows()
        };
        assert_eq!(run(60, 10), ((10, 19), (51, 60)));
        assert_eq!(run(5, 1), ((1, 2), (4, 5)));
    }
}
