//! The agentic JSONL format (the derived SWE-smith trace, the real Claude Code sessions,
//! and any closed-loop generator written out with [`write()`]): closed loop, one line per
//! LLM call, with explicit sessions, turns and tool gaps. A subagent (`spawned_by`,
//! `spawn_after_turn`) starts when the parent's call of that turn completes, as the tool
//! call that spawned it runs, not at t = 0. Optional fields a generator's sessions need:
//! `start_ms` (when a session's first call is sent; 0), `spawn_after_gap` (a forked
//! rollout starts after the spawning call's tool gap; false), `samples` (choices `n`; 1),
//! `fork` (the call is an explicit fork, `x-ownerserve-fork`; false).

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{LineProblem, WorkloadError};
use super::jsonl::{line_error, parse_lines, read_text};
use super::mooncake::stem;
use super::{blocks_for, Ending, ForkOf, Loop, Session, Step, Workload};

#[derive(Deserialize, Serialize)]
struct Record {
    session_id: String,
    turn: u32,
    parent_turn: Option<u32>,
    input_length: u32,
    output_length: u32,
    // `tool_calls` (tool names) is read by nothing downstream and so is ignored.
    tool_gap_ms: f64,
    block_size: u32,
    hash_ids: Vec<u64>,
    /// A subagent's parent session and the parent's turn whose tool call spawned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spawned_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spawn_after_turn: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    spawn_after_gap: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    start_ms: f64,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    samples: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    fork: bool,
    /// How the call's response ended (Claude Code's `tool_use`, `end_turn`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stop: Option<String>,
}

/// A trace's `stop` as an [`Ending`]: a tool call, an answer, or not said.
fn ending_of(stop: Option<&str>) -> Ending {
    match stop {
        Some("tool_use" | "tool_calls") => Ending::ToolCall,
        Some("end_turn" | "stop" | "max_tokens" | "length" | "stop_sequence") => Ending::Answer,
        _ => Ending::Unknown,
    }
}

fn is_false(b: &bool) -> bool {
    !b
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Writes a closed-loop workload in this format, one line per call, sessions in order:
/// what [`parse`] reads back into the same sessions (names aside; times to within an ulp). `None` for an open-loop
/// workload (its calls have absolute arrivals this format has no field for).
pub fn write(wl: &Workload) -> Option<String> {
    if wl.looping != Loop::Closed {
        return None;
    }
    let mut out = String::new();
    for s in &wl.sessions {
        let spawn = s.fork_of.and_then(|f| {
            let parent = wl.sessions.get(f.session)?;
            Some((
                parent.id.clone(),
                parent.steps.get(f.step)?.turn,
                f.after_gap,
            ))
        });
        for (i, st) in s.steps.iter().enumerate() {
            let r = Record {
                session_id: s.id.clone(),
                turn: st.turn,
                parent_turn: st.parent,
                input_length: st.input_tokens,
                output_length: st.output_tokens,
                tool_gap_ms: st.gap_after_ms,
                block_size: wl.hash_block,
                hash_ids: st.hash_ids.clone(),
                spawned_by: spawn.as_ref().map(|(p, _, _)| p.clone()),
                spawn_after_turn: spawn.as_ref().map(|(_, t, _)| *t),
                spawn_after_gap: spawn.as_ref().is_some_and(|(_, _, g)| *g),
                start_ms: if i == 0 { s.start_ms } else { 0.0 },
                samples: st.samples,
                fork: st.fork,
                stop: match st.ending {
                    Ending::ToolCall => Some("tool_use".to_owned()),
                    Ending::Answer => Some("end_turn".to_owned()),
                    Ending::Unknown => None,
                },
            };
            // A record of numbers and strings always serialises.
            out.push_str(&serde_json::to_string(&r).unwrap_or_default());
            out.push('\n');
        }
    }
    Some(out)
}

/// Reads the derived agentic JSONL into a closed-loop workload; sessions keep the order in
/// which they first appear and their steps are sorted by turn.
pub fn read(path: impl AsRef<Path>) -> Result<Workload, WorkloadError> {
    let path = path.as_ref();
    parse(&read_text(path)?, path)
}

/// Parses the text of a derived agentic trace; `path` is only used in errors and the name.
pub fn parse(text: &str, path: &Path) -> Result<Workload, WorkloadError> {
    let records: Vec<(usize, Record)> = parse_lines(text, path)?;
    let block = records.first().map(|(_, r)| r.block_size).unwrap_or(0);
    let mut sessions: Vec<Session> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    // Per subagent session: its parent's id, spawning turn and whether it waits for that
    // call's tool gap, as first read.
    let mut spawns: Vec<(usize, String, u32, bool)> = Vec::new();
    for (line, r) in records {
        if r.block_size != block || block == 0 {
            let problem = LineProblem::BlockSize {
                expected: block,
                found: r.block_size,
            };
            return Err(line_error(path, line, problem));
        }
        let expected = blocks_for(r.input_length, block);
        if r.hash_ids.len() != expected {
            let problem = LineProblem::HashIdsLength {
                expected,
                found: r.hash_ids.len(),
            };
            return Err(line_error(path, line, problem));
        }
        let next = sessions.len();
        let si = *index.entry(r.session_id.clone()).or_insert(next);
        if si == next {
            if let (Some(parent), Some(turn)) = (r.spawned_by, r.spawn_after_turn) {
                spawns.push((si, parent, turn, r.spawn_after_gap));
            }
            sessions.push(Session {
                id: r.session_id,
                start_ms: r.start_ms.max(0.0),
                fork_of: None,
                steps: Vec::new(),
            });
        }
        let Some(session) = sessions.get_mut(si) else {
            continue;
        };
        if session.steps.iter().any(|s| s.turn == r.turn) {
            return Err(line_error(
                path,
                line,
                LineProblem::DuplicateTurn { turn: r.turn },
            ));
        }
        session.steps.push(Step {
            turn: r.turn,
            parent: r.parent_turn,
            input_tokens: r.input_length,
            output_tokens: r.output_length,
            hash_ids: r.hash_ids,
            arrival_ms: None,
            gap_after_ms: r.tool_gap_ms.max(0.0),
            samples: r.samples.max(1),
            fork: r.fork,
            ending: ending_of(r.stop.as_deref()),
        });
    }
    for s in &mut sessions {
        s.steps.sort_by_key(|st| st.turn);
    }
    for (si, parent, turn, after_gap) in spawns {
        // The parent's last call at or before the spawning turn (a parent cut short of it
        // spawns at its last call); a parent not in the file leaves it at t = 0.
        let Some(&p) = index.get(&parent).filter(|&&p| p != si) else {
            continue;
        };
        let step = sessions[p].steps.iter().rposition(|st| st.turn <= turn);
        sessions[si].fork_of = step.map(|step| ForkOf {
            session: p,
            step,
            after_gap,
        });
    }
    Ok(Workload {
        name: stem(path),
        hash_block: block,
        looping: Loop::Closed,
        sessions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/continuum_swesmith_derived.jsonl"
    );

    #[test]
    fn shipped_trace_has_five_sessions_of_125_calls() {
        let w = read(TRACE).expect("read swe-smith");
        assert_eq!(w.num_requests(), 125);
        assert_eq!(w.sessions.len(), 5);
        assert_eq!(w.hash_block, 16);
        assert_eq!(w.looping, Loop::Closed);
        w.check().expect("contract holds");
        // The README's "24-32 calls" is off by one session: it has 21.
        let calls: Vec<usize> = w.sessions.iter().map(|s| s.steps.len()).collect();
        assert_eq!(calls, vec![24, 21, 32, 24, 24]);
        for s in &w.sessions {
            assert_eq!(s.steps.first().map(|st| st.parent), Some(None));
        }
        let first = w.sessions.first().and_then(|s| s.steps.first());
        assert_eq!(first.map(|s| s.gap_after_ms), Some(547.6));
        let stats = w.stats();
        assert!((stats.reuse_ratio - 0.905).abs() < 0.01, "{stats}");
    }

    fn line(block: u32, input: u32, ids: &str) -> String {
        format!(
            "{{\"session_id\": \"a\", \"turn\": 0, \"parent_turn\": null, \"input_length\": {input}, \"output_length\": 3, \"tool_calls\": [], \"tool_gap_ms\": 1.5, \"block_size\": {block}, \"hash_ids\": [{ids}]}}\n"
        )
    }

    #[test]
    fn bad_lines_name_the_line() {
        let good = line(16, 20, "1, 2");
        let cases = [
            format!("{good}\n{}", line(32, 20, "1")),
            format!("{good}\n{}", line(16, 20, "1")),
            format!("{good}\n{{\"session_id\": 3}}\n"),
            // Same session, same turn.
            format!("{good}\n{good}"),
        ];
        for text in &cases {
            let err = parse(text, Path::new("s.jsonl")).expect_err("bad line");
            assert_eq!(err.line(), Some(3), "{err}");
        }
        let zero = line(0, 0, "");
        let err = parse(&zero, Path::new("s.jsonl")).expect_err("zero block");
        assert_eq!(err.line(), Some(1));
    }

    #[test]
    fn generated_workloads_are_written_and_read_back_the_same() {
        for name in [
            "repo-swarm",
            "forked",
            "forked-samples",
            "long-gap",
            "coding-agent",
        ] {
            let spec = crate::scenario::WorkloadSpec {
                workload: name.to_owned(),
                sessions: Some(6),
                ..Default::default()
            };
            let wl = spec.build().expect("builds");
            let text = write(&wl).expect("closed loop");
            let back = parse(&text, Path::new("w.jsonl")).expect("reads back");
            back.check().expect("contract holds");
            assert_eq!(back.sessions.len(), wl.sessions.len(), "{name}");
            for (a, b) in back.sessions.iter().zip(&wl.sessions) {
                let what = format!("{name} {}", b.id);
                assert_eq!(
                    (&a.id, a.start_ms, a.fork_of),
                    (&b.id, b.start_ms, b.fork_of),
                    "{what}"
                );
                for (x, y) in a.steps.iter().zip(&b.steps) {
                    // serde_json reads a float back to within an ulp.
                    let key = |s: &Step| {
                        let gap_us = (s.gap_after_ms * 1e3).round();
                        (
                            s.turn,
                            s.parent,
                            s.input_tokens,
                            s.output_tokens,
                            gap_us,
                            s.samples,
                            s.fork,
                        )
                    };
                    assert_eq!(key(x), key(y), "{what}");
                    assert!(x.hash_ids == y.hash_ids, "{what}: hash ids");
                }
                assert_eq!(a.steps.len(), b.steps.len(), "{what}");
            }
            assert_eq!(back.hash_block, wl.hash_block);
        }
        let open = crate::scenario::WorkloadSpec {
            workload: "mooncake".to_owned(),
            max_requests: 5,
            ..Default::default()
        };
        assert!(write(&open.build().expect("builds")).is_none());
    }

    /// A call of `session`, turn `turn`; `spawn` names the parent and its turn.
    fn call(session: &str, turn: u32, gap_ms: f64, spawn: Option<(&str, u32)>) -> String {
        let parent = if turn == 0 {
            "null".to_owned()
        } else {
            (turn - 1).to_string()
        };
        let spawn = spawn.map_or(String::new(), |(p, t)| {
            format!(", \"spawned_by\": \"{p}\", \"spawn_after_turn\": {t}")
        });
        format!(
            "{{\"session_id\": \"{session}\", \"turn\": {turn}, \"parent_turn\": {parent}, \"input_length\": 20, \"output_length\": 3, \"tool_calls\": [], \"tool_gap_ms\": {gap_ms}, \"block_size\": 16, \"hash_ids\": [{turn}, 9{turn}]{spawn}}}\n"
        )
    }

    #[test]
    fn a_subagent_starts_when_its_parents_spawning_call_completes() {
        let text = [
            call("p", 0, 100.0, None),
            call("p", 1, 30_000.0, None),
            call("p", 2, 100.0, None),
            call("p.sa1", 0, 50.0, Some(("p", 1))),
            call("p.sa1", 1, 50.0, Some(("p", 1))),
            // Spawned after a turn the parent was cut short of: at its last call.
            call("p.sa2", 0, 50.0, Some(("p", 7))),
            // A parent not in the file: at t = 0.
            call("q.sa1", 0, 50.0, Some(("q", 0))),
        ]
        .concat();
        let w = parse(&text, Path::new("cc.jsonl")).expect("parses");
        w.check().expect("contract holds");
        let fork = |i: usize| w.sessions[i].fork_of;
        let at = |step| {
            Some(ForkOf {
                session: 0,
                step,
                after_gap: false,
            })
        };
        assert_eq!(
            (fork(0), fork(1), fork(2), fork(3)),
            (None, at(1), at(2), None)
        );
        // In the simulator the subagent's first call goes when the parent's turn-1 call
        // ends, not after that call's 30 s gap (which the subagent's own run is part of).
        let c = crate::sim::Cluster::parse("1h", &Default::default()).expect("cluster");
        let r = crate::report::run_one("round_robin", &w, &c, &Default::default(), &|_| {})
            .expect("runs");
        let rec = |session, step| {
            r.steps
                .iter()
                .find(|s| s.session == session && s.step == step)
                .expect("ran")
        };
        let parent = rec(0, 1);
        let ended = parent.issued_s + parent.latency_s;
        assert!((rec(1, 0).issued_s - ended).abs() < 1e-9, "{ended}");
        assert!(rec(0, 2).issued_s >= ended + 30.0);
    }
}
