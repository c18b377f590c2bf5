//! Reader for the Mooncake FAST'25 JSONL traces: open loop, 512-token blocks, and sessions
//! inferred from prefix continuation because the trace has no session ids.
//!
//! # Session inference
//! Requests are taken in arrival order (ties keep file order). A request's *context* is its
//! full blocks: all its ids, or all but the last when its input is not a multiple of 512
//! (the partial last block changes once text is appended, so a continuation carries a new
//! id there). Request `r` joins the session of the most recent earlier request whose context
//! is a proper prefix of `r`'s ids. Otherwise it starts session `mc-<position>`, where
//! position is its 0-based index in arrival order.
//!
//! Beyond the plain prefix rule, a context is registered only if it holds at least one
//! block that no earlier request had. A context made only of already-seen blocks (say, a
//! popular system prompt) is not any one conversation's history, and matching on it
//! would merge unrelated users. `trace_stats.py`, which produced the trace statistics the
//! team quotes, uses the same restriction, but it always drops the last id, even when the
//! last block is full. It therefore counts 269 chains where this rule counts 268.
//!
//! Contexts are keyed by (length, rolling hash of the ids), so the lookup is linear in the
//! ids. A hit is compared id by id, so a hash collision can never join the wrong session.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::error::{LineProblem, WorkloadError};
use super::jsonl::{line_error, parse_lines, read_text};
use super::tokens::mix64;
use super::{blocks_for, Loop, Session, Step, Workload};

/// Block size of the Mooncake traces' hash ids.
pub const MOONCAKE_BLOCK: u32 = 512;

#[derive(Deserialize)]
struct Record {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Reads a Mooncake JSONL trace into an open-loop workload with inferred sessions.
pub fn read(path: impl AsRef<Path>) -> Result<Workload, WorkloadError> {
    let path = path.as_ref();
    parse(&read_text(path)?, path)
}

/// Parses the text of a Mooncake trace; `path` is only used in errors and the name.
pub fn parse(text: &str, path: &Path) -> Result<Workload, WorkloadError> {
    let mut records: Vec<(usize, Record)> = parse_lines(text, path)?;
    for (line, r) in &records {
        let expected = blocks_for(r.input_length, MOONCAKE_BLOCK);
        if r.hash_ids.len() != expected {
            let problem = LineProblem::HashIdsLength {
                expected,
                found: r.hash_ids.len(),
            };
            return Err(line_error(path, *line, problem));
        }
    }
    // Stable: equal timestamps keep file order.
    records.sort_by(|a, b| a.1.timestamp.total_cmp(&b.1.timestamp));
    let owner = infer_sessions(&records);

    let mut sessions: Vec<Session> = Vec::new();
    let mut place: Vec<(usize, u32)> = Vec::with_capacity(records.len());
    for (pos, (_, r)) in records.iter().enumerate() {
        let (session, parent) = match owner.get(pos).copied().flatten() {
            Some(p) => {
                let (s, turn) = place.get(p).copied().unwrap_or_default();
                (s, Some(turn))
            }
            None => {
                sessions.push(Session {
                    id: format!("mc-{pos}"),
                    start_ms: r.timestamp,
                    fork_of: None,
                    steps: Vec::new(),
                });
                (sessions.len() - 1, None)
            }
        };
        let Some(s) = sessions.get_mut(session) else {
            continue;
        };
        let turn = s.steps.len() as u32;
        s.steps.push(Step {
            turn,
            parent,
            input_tokens: r.input_length,
            output_tokens: r.output_length,
            hash_ids: r.hash_ids.clone(),
            arrival_ms: Some(r.timestamp),
            gap_after_ms: 0.0,
            samples: 1,
            fork: false,
            ending: crate::workload::Ending::Unknown,
        });
        place.push((session, turn));
    }
    Ok(Workload {
        name: stem(path),
        hash_block: MOONCAKE_BLOCK,
        looping: Loop::Open,
        sessions,
    })
}

/// For each request (in arrival order), the position of the earlier request it continues.
fn infer_sessions(records: &[(usize, Record)]) -> Vec<Option<usize>> {
    let mut contexts: HashMap<(usize, u64), usize> = HashMap::new();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut owner = Vec::with_capacity(records.len());
    let mut rolling = Vec::new();
    for (pos, (_, r)) in records.iter().enumerate() {
        let ids = &r.hash_ids;
        rolling.clear();
        let mut h = 0u64;
        for &id in ids {
            h = mix64(h.rotate_left(17) ^ id);
            rolling.push(h);
        }
        // Proper prefixes only: k < ids.len(); the most recent matching request wins.
        let mut best: Option<usize> = None;
        for (k, &h) in rolling.iter().enumerate().take(ids.len().saturating_sub(1)) {
            let len = k + 1;
            let Some(&p) = contexts.get(&(len, h)) else {
                continue;
            };
            let same = records
                .get(p)
                .and_then(|(_, e)| e.hash_ids.get(..len))
                .is_some_and(|prefix| prefix == &ids[..len]);
            if same && best.is_none_or(|b| p > b) {
                best = Some(p);
            }
        }
        owner.push(best);

        let full = if r.input_length.is_multiple_of(MOONCAKE_BLOCK) {
            ids.len()
        } else {
            ids.len().saturating_sub(1)
        };
        if full > 0 && ids[..full].iter().any(|id| !seen.contains(id)) {
            if let Some(&h) = rolling.get(full - 1) {
                contexts.insert((full, h), pos);
            }
        }
        seen.extend(ids.iter().copied());
    }
    owner
}

/// The file name without extension, as the workload's name.
pub(crate) fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/mooncake_synthetic_trace.jsonl"
    );

    #[test]
    fn shipped_trace_has_the_readme_counts_and_chains() {
        let w = read(TRACE).expect("read mooncake");
        assert_eq!(w.num_requests(), 3993);
        assert_eq!(w.hash_block, 512);
        assert_eq!(w.looping, Loop::Open);
        w.check().expect("contract holds");
        let chains: Vec<usize> = w
            .sessions
            .iter()
            .map(|s| s.steps.len())
            .filter(|&n| n >= 2)
            .collect();
        // README: 269 chains, mean 6.0, max 24; see the module doc for the 268.
        assert!(
            (250..=290).contains(&chains.len()),
            "{} chains",
            chains.len()
        );
        assert_eq!(chains.iter().max(), Some(&24));
        let mean = chains.iter().sum::<usize>() as f64 / chains.len() as f64;
        assert!((5.5..=6.5).contains(&mean), "mean chain {mean}");
        let stats = w.stats();
        assert!((stats.reuse_ratio - 0.640).abs() < 0.01, "{stats}");
        assert_eq!(stats.input_p50, 11_587);
    }

    #[test]
    fn continuation_extends_the_full_blocks_and_replaces_the_partial_one() {
        let text = "\
{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}
{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [7, 8]}
{\"timestamp\": 10, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1, 3, 4]}
{\"timestamp\": 20, \"input_length\": 2000, \"output_length\": 5, \"hash_ids\": [1, 3, 5, 6]}
{\"timestamp\": 30, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 9]}
";
        let w = parse(text, Path::new("t.jsonl")).expect("parse");
        let shape: Vec<(String, Vec<Option<u32>>)> = w
            .sessions
            .iter()
            .map(|s| (s.id.clone(), s.steps.iter().map(|st| st.parent).collect()))
            .collect();
        // [1,3,4] continues [1,2] through its full block 1; [1,9] also does ([1] is request
        // 0's context, request 2's is [1,3]); [1,3,5,6] continues [1,3,4].
        assert_eq!(
            shape,
            vec![
                ("mc-0".to_string(), vec![None, Some(0), Some(1), Some(0)]),
                ("mc-1".to_string(), vec![None]),
            ]
        );
    }

    #[test]
    fn context_of_only_seen_blocks_is_not_registered() {
        // Request 1's context [1, 2] is all request 0's blocks, so it is not registered and
        // request 2 continues request 0 (turn 0), not request 1.
        let text = "\
{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}
{\"timestamp\": 1, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 4]}
{\"timestamp\": 2, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 5]}
";
        let w = parse(text, Path::new("t.jsonl")).expect("parse");
        let parents: Vec<Vec<Option<u32>>> = w
            .sessions
            .iter()
            .map(|s| s.steps.iter().map(|st| st.parent).collect())
            .collect();
        assert_eq!(parents, vec![vec![None, Some(0), Some(0)]]);
    }

    #[test]
    fn session_inference_does_not_scan_earlier_requests() {
        // 150,000 two-turn conversations: one full block, then that block and a partial
        // one. Linear inference takes well under a second even in a debug build; one that
        // scanned the earlier requests for each would make ~4.5e10 comparisons (tens of
        // minutes). The limit sits far from both, so no load on the machine decides it (a
        // ratio of two timed sizes did: it failed under CI's load).
        const CONVS: u64 = 150_000;
        let mut records = Vec::new();
        for c in 0..CONVS {
            for (turn, input_length) in [(0, MOONCAKE_BLOCK), (1, MOONCAKE_BLOCK + 100)] {
                let record = Record {
                    timestamp: (c * 2 + turn) as f64,
                    input_length,
                    output_length: 10,
                    hash_ids: (0..=turn).map(|k| c * 2 + k).collect(),
                };
                records.push((records.len(), record));
            }
        }
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(infer_sessions(&records)));
        let owner = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("inference of 300,000 requests finished within 60 s");
        for (pos, parent) in owner.iter().enumerate() {
            let expected = (pos % 2 == 1).then(|| pos - 1);
            assert_eq!(*parent, expected, "request {pos}");
        }
    }

    #[test]
    fn bad_lines_name_the_line() {
        let cases = [
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n",
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1]}\n",
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 1, \"hash_ids\": []}\n",
        ];
        for text in cases {
            let err = parse(text, Path::new("m.jsonl")).expect_err("bad line");
            assert_eq!(err.line(), Some(2), "{err}");
            assert!(err.to_string().contains("m.jsonl:2"), "{err}");
        }
        assert!(matches!(
            parse("\n", Path::new("m.jsonl")),
            Err(WorkloadError::Empty { .. })
        ));
        assert!(matches!(
            read("/nonexistent/trace.jsonl"),
            Err(WorkloadError::Io { .. })
        ));
    }
}
