//! Reader for the agentic JSONL traces (the derived SWE-smith trace, the real Claude Code
//! sessions): closed loop, one line per LLM call, with explicit sessions, turns and tool
//! gaps. A subagent (`spawned_by`, `spawn_after_turn`) starts when the parent's call of
//! that turn completes, as the tool call that spawned it runs, not at t = 0.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::error::{LineProblem, WorkloadError};
use super::jsonl::{line_error, parse_lines, read_text};
use super::mooncake::stem;
use super::{blocks_for, ForkOf, Loop, Session, Step, Workload};

#[derive(Deserialize)]
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
    #[serde(default)]
    spawned_by: Option<String>,
    #[serde(default)]
    spawn_after_turn: Option<u32>,
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
    // Per subagent session: its parent's id and spawning turn, as first read.
    let mut spawns: Vec<(usize, String, u32)> = Vec::new();
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
                spawns.push((si, parent, turn));
            }
            sessions.push(Session {
                id: r.session_id,
                start_ms: 0.0,
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
            samples: 1,
            fork: false,
        });
    }
    for s in &mut sessions {
        s.steps.sort_by_key(|st| st.turn);
    }
    for (si, parent, turn) in spawns {
        // The parent's last call at or before the spawning turn (a parent cut short of it
        // spawns at its last call); a parent not in the file leaves it at t = 0.
        let Some(&p) = index.get(&parent).filter(|&&p| p != si) else {
            continue;
        };
        let step = sessions[p].steps.iter().rposition(|st| st.turn <= turn);
        sessions[si].fork_of = step.map(|step| ForkOf {
            session: p,
            step,
            after_gap: false,
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
