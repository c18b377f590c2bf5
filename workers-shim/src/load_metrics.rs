//! Reads an engine's `/metrics` (Prometheus text format) into an [`EngineLoad`]: vLLM's
//! `vllm:num_requests_running` / `vllm:num_requests_waiting` / `vllm:kv_cache_usage_perc`
//! (or the older `vllm:gpu_cache_usage_perc`), SGLang's `sglang:num_running_reqs` /
//! `sglang:num_queue_reqs` / `sglang:token_usage`. Counts are summed over label sets (data
//! parallel ranks); SGLang samples of tensor-parallel ranks other than 0 are duplicates and
//! skipped; KV usage is averaged. Comments, `_total`/`_created` series, timestamps and
//! unknown metrics are ignored.

use ownerserve_planner::policy::EngineLoad;

/// An exposition without any load gauge we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no vLLM or SGLang load gauges in the metrics")]
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

/// Parses an exposition into a load.
pub fn parse_load(text: &str) -> Result<EngineLoad, NoLoadMetrics> {
    let (mut running, mut waiting) = (None::<f64>, None::<f64>);
    let (mut usage_sum, mut usage_n) = (0.0, 0u32);
    let (mut legacy_usage_sum, mut legacy_usage_n) = (0.0, 0u32);
    for (name, labels, value) in text.lines().filter_map(sample) {
        if !value.is_finite() {
            continue;
        }
        if name.starts_with("sglang:") && label(labels, "tp_rank").is_some_and(|r| r != "0") {
            continue;
        }
        match name {
            "vllm:num_requests_running" | "sglang:num_running_reqs" => {
                *running.get_or_insert(0.0) += value;
            }
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                *waiting.get_or_insert(0.0) += value;
            }
            "vllm:kv_cache_usage_perc" | "sglang:token_usage" => {
                usage_sum += value;
                usage_n += 1;
            }
            "vllm:gpu_cache_usage_perc" => {
                legacy_usage_sum += value;
                legacy_usage_n += 1;
            }
            _ => {}
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
    })
}

/// The KV block size (tokens) an engine reports in its `/metrics`: vLLM's (and our sim
/// engine's) `vllm:cache_config_info{block_size="N",...}`. `None` when it reports none.
pub fn kv_block_size(text: &str) -> Option<u32> {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = &line[line.find('{')? + 1..line.rfind('}')?];
    labels.split(',').find_map(|pair| {
        let value = pair.trim().strip_prefix("block_size=")?;
        value.trim_matches('"').parse().ok()
    })
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
                kv_usage: 0.375
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
                kv_usage: 0.8
            })
        );
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

    #[test]
    fn the_block_size_is_read_from_vllms_cache_config() {
        let vllm = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"32\",cache_dtype=\"auto\",hash_block_size=\"None\"} 1.0\n";
        assert_eq!(kv_block_size(vllm), Some(32));
        assert_eq!(kv_block_size("sglang:num_running_reqs 0\n"), None);
    }
}
