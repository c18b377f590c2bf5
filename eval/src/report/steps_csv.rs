//! Every step of a run as CSV: where it ran, what its plan predicted and what its client
//! saw, for finding out step by step why a policy loses (`simulate --steps-csv`).

use std::fmt::Write as _;

use crate::sim::RunResult;

/// The run's steps, one line each, in completion order, with a header line.
pub fn steps_csv(run: &RunResult) -> String {
    let mut out = String::from(
        "session,step,issued_s,ttft_s,tpot_s,latency_s,prompt_tokens,cached_tokens,action,\
         decode_on,prefill_on,admit_wait_s,planned_queue_s,planned_compute_s,\
         planned_interference_s,running_there,planned_reused_tokens,waiting_there,\
         kv_free_there,prefill_tokens_there,preempted_while_waiting\n",
    );
    let opt = |w: Option<usize>| w.map_or(String::new(), |w| w.to_string());
    for s in &run.steps {
        let p = &s.placement;
        let _ = writeln!(
            out,
            "{},{},{:.4},{:.4},{:.5},{:.4},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{},{}",
            s.session,
            s.step,
            s.issued_s,
            s.ttft_s,
            s.tpot_s,
            s.latency_s,
            s.prompt_tokens,
            s.cached_tokens,
            p.action.unwrap_or(""),
            opt(p.decode_on),
            opt(p.prefill_on),
            p.admit_wait_s,
            p.planned_queue_s,
            p.planned_compute_s,
            p.planned_interference_s,
            p.running_there,
            p.planned_reused_tokens,
            p.waiting_there,
            p.kv_free_there,
            p.prefill_tokens_there,
            p.preempted_while_waiting,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Placement, StepRecord};

    #[test]
    fn one_line_per_step_with_where_it_ran() {
        let run = RunResult {
            steps: vec![StepRecord {
                session: 3,
                step: 1,
                issued_s: 2.0,
                ttft_s: 0.5,
                tpot_s: f64::NAN,
                latency_s: 1.0,
                prompt_tokens: 100,
                cached_tokens: 64,
                restored_tokens: 0,
                rejected: false,
                placement: Placement {
                    action: Some("remote_prefill"),
                    decode_on: Some(4),
                    prefill_on: Some(0),
                    ..Placement::default()
                },
            }],
            ..RunResult::default()
        };
        let csv = steps_csv(&run);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        let cols: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(cols.len(), lines[0].split(',').count());
        assert_eq!(
            (cols[0], cols[8], cols[9], cols[10]),
            ("3", "remote_prefill", "4", "0")
        );
    }
}
