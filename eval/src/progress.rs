//! A one-line progress bar on stderr for long evaluation runs.
//!
//! The text of the line is a pure function of (done, total, elapsed) — see `render` — so
//! it is unit-tested; [`Progress`] only decides when to write it. Progress reporting is
//! best-effort: a failed write to stderr is ignored rather than failing the run.
//!
//! Wall-clock time is read here on purpose (it is what the user watches); nothing in a
//! simulation decision may depend on it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bar width in cells.
const BAR_CELLS: u64 = 30;
/// Minimum time between two redraws on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Percent steps between two plain lines when stderr is not a terminal.
const PLAIN_STEP_PERCENT: u64 = 10;
/// `last_mark` before the first terminal draw.
const NEVER: u64 = u64::MAX;

/// A one-line progress bar on stderr ("label [#####-----] 45% 4,500/10,000 12.3s"), redrawn at most ~10 times a second; when stderr is not a terminal it prints a plain line at most every ~10%, and nothing at all when `quiet`.
///
/// Counters are atomics, so `set`/`inc` take `&self` and the bar may be shared by
/// reference (also across threads). Dropping it calls [`Progress::finish`].
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: u64,
    output: Output,
    started: Instant,
    done: AtomicU64,
    /// Terminal: milliseconds after `started` of the last redraw (`NEVER` before the first).
    /// Plain: the last printed multiple of `PLAIN_STEP_PERCENT`, as a step count.
    last_mark: AtomicU64,
    finished: AtomicBool,
}

/// Where the bar goes, fixed at construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Quiet,
    /// Redrawn in place with `\r`.
    Terminal,
    /// Appended as whole lines, for logs and CI.
    Plain,
}

impl Progress {
    /// Starts the clock for `total` units of work labelled `label`.
    pub fn new(label: &str, total: u64, quiet: bool) -> Self {
        let output = if quiet {
            Output::Quiet
        } else if std::io::stderr().is_terminal() {
            Output::Terminal
        } else {
            Output::Plain
        };
        Self::with_output(label, total, output)
    }

    fn with_output(label: &str, total: u64, output: Output) -> Self {
        Self {
            label: label.to_owned(),
            total,
            output,
            started: Instant::now(),
            done: AtomicU64::new(0),
            last_mark: AtomicU64::new(if output == Output::Terminal { NEVER } else { 0 }),
            finished: AtomicBool::new(false),
        }
    }

    /// Records that `done` units are complete.
    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.maybe_draw(done);
    }

    /// Records `n` more completed units.
    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        self.maybe_draw(done);
    }

    /// Writes the final line with the elapsed time; later calls (and drop) write nothing.
    pub fn finish(&self) {
        if self.output == Output::Quiet || self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        let line = self.line(self.done.load(Ordering::Relaxed));
        match self.output {
            Output::Terminal => write_stderr(&format!("\r{line}\x1b[K\n")),
            Output::Plain => write_stderr(&format!("{line}\n")),
            Output::Quiet => {}
        }
    }

    fn maybe_draw(&self, done: u64) {
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        match self.output {
            Output::Quiet => {}
            // The exchange in `claim` lets only one of several racing callers draw.
            Output::Terminal => {
                let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NEVER - 1);
                let last = self.last_mark.load(Ordering::Relaxed);
                if redraw_due(last, now_ms) && self.claim(last, now_ms) {
                    write_stderr(&format!("\r{}\x1b[K", self.line(done)));
                }
            }
            Output::Plain => {
                let last = self.last_mark.load(Ordering::Relaxed);
                if let Some(step) = plain_step_due(last, done, self.total) {
                    if self.claim(last, step) {
                        write_stderr(&format!("{}\n", self.line(done)));
                    }
                }
            }
        }
    }

    fn claim(&self, seen: u64, mark: u64) -> bool {
        self.last_mark
            .compare_exchange(seen, mark, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn line(&self, done: u64) -> String {
        render(
            &self.label,
            done,
            self.total,
            self.started.elapsed(),
            BAR_CELLS,
        )
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn write_stderr(text: &str) {
    let mut stderr = std::io::stderr().lock();
    // Best-effort: a closed stderr must not abort an evaluation.
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// Whether a terminal redraw is due at `now_ms`, given the last one at `last_ms`.
fn redraw_due(last_ms: u64, now_ms: u64) -> bool {
    last_ms == NEVER || now_ms >= last_ms.saturating_add(REDRAW_EVERY.as_millis() as u64)
}

/// The new step to print in plain mode, if `done` reached a step past `last_step`. 100% is
/// never due here: `finish` prints that line, with the final elapsed time.
fn plain_step_due(last_step: u64, done: u64, total: u64) -> Option<u64> {
    let step = percent(done, total) / PLAIN_STEP_PERCENT;
    (step > last_step && step < 100 / PLAIN_STEP_PERCENT).then_some(step)
}

/// The progress line: `label [#####-----] 45% 4,500/10,000 12.3s`.
pub(crate) fn render(label: &str, done: u64, total: u64, elapsed: Duration, cells: u64) -> String {
    format!(
        "{label} {} {}% {}/{} {}",
        bar(done, total, cells),
        percent(done, total),
        thousands(done),
        thousands(total),
        clock(elapsed)
    )
}

/// Whole percent complete, rounded down and capped at 100; an empty job is 100% done.
fn percent(done: u64, total: u64) -> u64 {
    if total == 0 {
        return 100;
    }
    (u128::from(done.min(total)) * 100 / u128::from(total)) as u64
}

/// `[###---]` with `cells` cells, filled to the nearest cell, but never full before the
/// work is.
fn bar(done: u64, total: u64, cells: u64) -> String {
    let filled = if total == 0 || done >= total {
        cells
    } else {
        let half_up = (u128::from(done) * u128::from(cells) * 2 + u128::from(total))
            / (u128::from(total) * 2);
        (half_up as u64).min(cells.saturating_sub(1))
    };
    let filled = filled as usize;
    let empty = cells as usize - filled;
    format!("[{}{}]", "#".repeat(filled), "-".repeat(empty))
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    let mut left_in_group = match digits.len() % 3 {
        0 => 3,
        partial => partial,
    };
    for digit in digits.chars() {
        if left_in_group == 0 {
            out.push(',');
            left_in_group = 3;
        }
        out.push(digit);
        left_in_group -= 1;
    }
    out
}

/// `12.3s` under a minute, then `4m05s`, then `1h02m03s`.
fn clock(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match secs {
        0..60 => format!("{:.1}s", elapsed.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m{:02}s", secs / 3600, secs / 60 % 60, secs % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_line() {
        let line = render("sim", 4_500, 10_000, Duration::from_millis(12_345), 10);
        assert_eq!(line, "sim [#####-----] 45% 4,500/10,000 12.3s");
    }

    #[test]
    fn bar_fills_to_the_nearest_cell_but_is_full_only_when_done() {
        assert_eq!(bar(0, 10, 10), "[----------]");
        assert_eq!(bar(1, 10, 10), "[#---------]");
        assert_eq!(bar(999, 1_000, 10), "[#########-]");
        assert_eq!(bar(1_000, 1_000, 10), "[##########]");
        assert_eq!(bar(5_000, 1_000, 10), "[##########]");
    }

    #[test]
    fn percent_rounds_down_and_caps() {
        assert_eq!(percent(0, 10), 0);
        assert_eq!(percent(999, 1_000), 99);
        assert_eq!(percent(1_000, 1_000), 100);
        assert_eq!(percent(2_000, 1_000), 100);
        assert_eq!(percent(u64::MAX - 1, u64::MAX), 99);
    }

    #[test]
    fn an_empty_job_is_complete() {
        let line = render("none", 0, 0, Duration::ZERO, 4);
        assert_eq!(line, "none [####] 100% 0/0 0.0s");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn clock_switches_units() {
        assert_eq!(clock(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(clock(Duration::from_secs(245)), "4m05s");
        assert_eq!(clock(Duration::from_secs(3_723)), "1h02m03s");
    }

    #[test]
    fn quiet_bar_counts_without_output() {
        let progress = Progress::new("quiet", 10, true);
        progress.set(4);
        progress.inc(3);
        assert_eq!(progress.done.load(Ordering::Relaxed), 7);
        progress.finish();
        progress.finish();
    }

    #[test]
    fn terminal_redraws_at_most_every_100ms() {
        assert!(redraw_due(NEVER, 0), "first draw is immediate");
        assert!(!redraw_due(1_000, 1_099));
        assert!(redraw_due(1_000, 1_100));
    }

    #[test]
    fn plain_output_marks_each_ten_percent_once() {
        assert_eq!(plain_step_due(0, 5, 100), None);
        assert_eq!(plain_step_due(0, 25, 100), Some(2));
        assert_eq!(plain_step_due(2, 29, 100), None);
        assert_eq!(plain_step_due(2, 30, 100), Some(3));
        assert_eq!(plain_step_due(8, 95, 100), Some(9));
        assert_eq!(plain_step_due(9, 100, 100), None, "finish prints 100%");
    }

    #[test]
    fn plain_bar_claims_each_step_once() {
        let progress = Progress::with_output("plain", 100, Output::Plain);
        assert!(progress.claim(0, 2));
        assert!(!progress.claim(0, 2), "a racing caller loses");
        progress.finished.store(true, Ordering::Relaxed);
    }

    /// `cargo test -p ownerserve-eval progress::tests::demo -- --ignored`: watch the bar.
    #[test]
    #[ignore = "takes a second and writes to stderr, for a human to look at"]
    fn demo() {
        let progress = Progress::new("demo", 10_000, false);
        for _ in 0..100 {
            progress.inc(100);
            std::thread::sleep(Duration::from_millis(10));
        }
        progress.finish();
    }
}
