//! The shape of the `[router]` table as written: its sub-tables (`[router.limits]`,
//! `[router.kv]`, `[router.planner]`, ...), the tagged `[router.policy]`, and the flat keys
//! of earlier releases, all rewritten into the one flat form [`RouterSettings`] reads.
//!
//! Each flat key that moved into a sub-table still loads, and leaves one note naming its
//! new key (logged once the logs are set up: [`RouterSettings::warn_deprecated`]). A
//! setting written both ways is refused, naming both.
//!
//! [`RouterSettings`]: super::RouterSettings
//! [`RouterSettings::warn_deprecated`]: super::RouterSettings::warn_deprecated

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::policy::PolicyTable;

/// Every `[router]` key that lives in a sub-table: its flat name (the field of
/// [`super::RouterSettings`], and the key earlier releases read) and its path under
/// `router`.
pub(super) const MOVED: &[(&str, &str)] = &[
    ("health_interval_ms", "health.interval_ms"),
    ("health_timeout_ms", "health.timeout_ms"),
    ("health_failure_threshold", "health.failure_threshold"),
    ("scrape_interval_ms", "health.scrape_interval_ms"),
    ("connect_timeout_ms", "upstream.connect_timeout_ms"),
    ("request_timeout_s", "upstream.request_timeout_s"),
    ("stream_idle_timeout_s", "upstream.stream_idle_timeout_s"),
    ("max_body_bytes", "limits.max_body_bytes"),
    ("max_choices", "limits.max_choices"),
    ("max_completion_tokens", "limits.max_completion_tokens"),
    ("max_connections", "limits.max_connections"),
    (
        "reserved_probe_connections",
        "limits.reserved_probe_connections",
    ),
    ("header_read_timeout_s", "limits.header_read_timeout_s"),
    ("body_read_timeout_s", "limits.body_read_timeout_s"),
    ("body_min_bytes_per_s", "limits.body_min_bytes_per_s"),
    ("max_inflight_body_mb", "limits.max_inflight_body_mb"),
    ("rate_limit_per_s", "limits.rate_limit_per_s"),
    ("rate_limit_burst", "limits.rate_limit_burst"),
    (
        "max_inflight_per_worker",
        "admission.max_inflight_per_worker",
    ),
    ("max_queued_per_model", "admission.max_queued_per_model"),
    ("queue_timeout_ms", "admission.queue_timeout_ms"),
    ("prompt_cache_mb", "prompt.cache_mb"),
    ("tokenize_threads", "prompt.tokenize_threads"),
    ("max_tokenizing_prompts", "prompt.max_tokenizing_prompts"),
    ("tokenize_timeout_ms", "prompt.tokenize_timeout_ms"),
    ("tokenizers", "prompt.tokenizers"),
    ("kv_block_size", "kv.block_size"),
    ("kv_index_max_blocks", "kv.index_max_blocks"),
    ("kv_approx_ttl_s", "kv.approx_ttl_s"),
    ("kv_redis_url", "kv.redis.url"),
    ("kv_redis_role", "kv.redis.role"),
    ("kv_redis_stream_prefix", "kv.redis.stream_prefix"),
    ("kv_redis_maxlen", "kv.redis.maxlen"),
    ("admin_token", "auth.admin_token"),
    ("read_token", "auth.read_token"),
    ("api_keys", "auth.api_keys"),
    ("metrics_public", "auth.metrics_public"),
    ("engine_api_key", "auth.engine_api_key"),
    ("directory", "directory.mode"),
    ("directory_data_dir", "directory.data_dir"),
    ("directory_urls", "directory.urls"),
    ("directory_secret", "directory.secret"),
    ("worker_lease_ttl_ms", "directory.worker_lease_ttl_ms"),
    ("ownership_flush_ms", "directory.ownership_flush_ms"),
    (
        "ownership_claim_timeout_ms",
        "directory.ownership_claim_timeout_ms",
    ),
    ("read_lease_ms", "directory.read_lease_ms"),
    ("planner_model", "planner.model"),
    ("models", "planner.models"),
    ("planner_gpu", "planner.gpu"),
    ("planner_gpus", "planner.gpus"),
    ("planner_link_gbs", "planner.link_gbs"),
    ("planner_link_latency_us", "planner.link_latency_us"),
    ("planner_links", "planner.links"),
    (
        "planner_max_num_batched_tokens",
        "planner.max_num_batched_tokens",
    ),
    (
        "planner_long_prefill_token_threshold",
        "planner.long_prefill_token_threshold",
    ),
    ("planner_lambda_s_per_gb", "planner.lambda_s_per_gb"),
    ("planner_mu", "planner.mu"),
    ("planner_nu", "planner.nu"),
    ("planner_kappa", "planner.kappa"),
    ("planner_rho", "planner.rho"),
    ("planner_migration_budget", "planner.migration_budget"),
    (
        "planner_prefill_workers_decode",
        "planner.prefill_workers_decode",
    ),
    ("planner_time_scale", "planner.time_scale"),
    ("planner_calibrate", "planner.calibrate"),
    ("session_lease_factor", "sessions.lease_factor"),
    ("session_lease_min_ms", "sessions.lease_min_ms"),
    ("session_lease_max_ms", "sessions.lease_max_ms"),
];

/// Keys that were never flat: written only in their sub-table, read into the field named
/// first.
pub(super) const NESTED_ONLY: &[(&str, &str)] = &[
    ("worker_warmup_s", "health.warmup_s"),
    (
        "directory_artifact_retention_s",
        "directory.artifact_retention_s",
    ),
    (
        "directory_session_retention_s",
        "directory.session_retention_s",
    ),
    ("kv_peers", "kv.peers"),
    ("admission_classes", "admission.classes"),
    ("admission_default_class", "admission.default_class"),
    ("session_lifecycle", "sessions.lifecycle"),
    ("session_gap_prior_median_s", "sessions.gap_prior_median_s"),
    ("session_gap_prior_p90_s", "sessions.gap_prior_p90_s"),
    ("session_return_priority", "sessions.return_priority"),
    ("session_admission", "sessions.admission"),
    (
        "session_admission_max_wait_ms",
        "sessions.admission_max_wait_ms",
    ),
    ("session_admission_headroom", "sessions.admission_headroom"),
];

/// Every key that lives in a sub-table: (field, path).
fn in_sections() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    MOVED.iter().chain(NESTED_ONLY)
}

/// The flat keys whose settings now belong to one policy in `[router.policy]`: flat name,
/// the policy, and its key there.
pub(super) const MOVED_TO_POLICY: &[(&str, &str, &str)] = &[
    ("kv_overlap_weight", "kv_aware", "overlap_weight"),
    ("kv_temperature", "kv_aware", "temperature"),
    ("busy_max_waiting", "kv_aware", "busy_max_waiting"),
    ("busy_max_kv_usage", "kv_aware", "busy_max_kv_usage"),
    (
        "busy_max_active_prefill_tokens",
        "kv_aware",
        "busy_max_active_prefill_tokens",
    ),
    ("session_ttl_s", "session_affinity", "ttl_s"),
];

/// The `[router]` table rewritten into its flat form, and a note for each deprecated key
/// it used.
#[derive(Debug, Default)]
pub(super) struct Flat {
    pub table: Table,
    /// `router.X is deprecated: use router.Y`, one per flat key used.
    pub deprecated: Vec<String>,
    /// Where each flat key was written (`router.limits.max_body_bytes`), to name both
    /// places of a setting written twice.
    written_as: BTreeMap<String, String>,
}

impl Flat {
    /// Sets flat key `key`, written at `path` (under `router.`); a key set twice is refused.
    fn put(&mut self, key: &str, path: &str, value: Value) -> Result<(), String> {
        if let Some(first) = self.written_as.insert(key.to_owned(), path.to_owned()) {
            let (old, new) = if first == key {
                (first.as_str(), path)
            } else {
                (path, first.as_str())
            };
            return Err(format!(
                "router.{old} and router.{new} are the same setting, set twice: \
                 keep router.{new} (router.{old} is deprecated)"
            ));
        }
        self.table.insert(key.to_owned(), value);
        Ok(())
    }
}

/// The sub-tables of `[router]`.
fn is_section(key: &str) -> bool {
    in_sections().any(|(_, path)| path.split('.').next() == Some(key))
}

/// The flat key stored at `path` (`limits.max_body_bytes` → `max_body_bytes`).
fn flat_key_at(path: &str) -> Option<&'static str> {
    in_sections()
        .find(|(_, p)| *p == path)
        .map(|(flat, _)| *flat)
}

/// Where a deprecated flat key lives now (`None`: it did not move).
fn new_home(key: &str) -> Option<String> {
    if let Some((_, path)) = MOVED.iter().find(|(flat, _)| *flat == key) {
        return Some(format!("router.{path}"));
    }
    MOVED_TO_POLICY
        .iter()
        .find(|(flat, _, _)| *flat == key)
        .map(|(_, policy, k)| format!("router.policy.{k} (with name = \"{policy}\")"))
}

/// Rewrites a `[router]` table, in the sub-table shape, the flat shape or a mix, into the
/// flat form; each flat key that moved leaves a note.
pub(super) fn flatten(router: Table) -> Result<Flat, String> {
    let mut flat = Flat::default();
    for (key, value) in router {
        match (key.as_str(), value) {
            ("policy", Value::Table(t)) => {
                for (key, written, value) in PolicyTable::from_table(t)?.flat_entries() {
                    flat.put(key, &written, value)?;
                }
            }
            (section, Value::Table(t)) if is_section(section) => {
                put_section(&mut flat, section, t)?;
            }
            (_, value) => {
                if let Some((_, path)) = NESTED_ONLY.iter().find(|(f, _)| *f == key) {
                    return Err(format!("unknown key `router.{key}`: it is `router.{path}`"));
                }
                if let Some(home) = new_home(&key) {
                    flat.deprecated
                        .push(format!("router.{key} is deprecated: use {home}"));
                }
                // Keys that did not move (host, port, policy = "name", ...) pass as they
                // are; unknown ones are refused by `RouterSettings`.
                flat.put(&key, &key, value)?;
            }
        }
    }
    Ok(flat)
}

/// Puts each key of the sub-table at `prefix` (`kv`, `kv.redis`) into `flat`.
fn put_section(flat: &mut Flat, prefix: &str, table: Table) -> Result<(), String> {
    for (key, value) in table {
        let path = format!("{prefix}.{key}");
        if let Some(flat_key) = flat_key_at(&path) {
            flat.put(flat_key, &path, value)?;
            continue;
        }
        let inner = format!("{path}.");
        match value {
            Value::Table(t) if in_sections().any(|(_, p)| p.starts_with(&inner)) => {
                put_section(flat, &path, t)?;
            }
            _ => return Err(unknown_key(prefix, &key)),
        }
    }
    Ok(())
}

/// `unknown key router.limits.foo`, with the keys `router.limits` takes.
fn unknown_key(prefix: &str, key: &str) -> String {
    let inner = format!("{prefix}.");
    let mut known: Vec<&str> = in_sections()
        .filter_map(|(_, p)| p.strip_prefix(&inner))
        .map(|rest| rest.split('.').next().unwrap_or(rest))
        .collect();
    known.dedup();
    format!(
        "unknown key `router.{prefix}.{key}`; [router.{prefix}] takes: {}",
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_moved_key_has_one_home_and_no_home_is_a_flat_key() {
        let mut flats: Vec<&str> = MOVED.iter().map(|(f, _)| *f).collect();
        flats.extend(MOVED_TO_POLICY.iter().map(|(f, _, _)| *f));
        let n = flats.len();
        flats.sort_unstable();
        flats.dedup();
        assert_eq!(flats.len(), n, "a flat key moved twice");
        let mut paths: Vec<&str> = MOVED.iter().map(|(_, p)| *p).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), MOVED.len(), "two keys moved to one path");
        for (_, path) in MOVED {
            let section = path.split('.').next().unwrap_or(path);
            assert!(
                section == "directory" || flat_key_at(section).is_none(),
                "section {section} is also a flat key"
            );
        }
    }

    #[test]
    fn an_unknown_key_in_a_sub_table_is_refused_with_what_it_takes() {
        let t: Table = toml::from_str("[kv]\nblock_sise = 16\n").unwrap();
        let e = flatten(t).unwrap_err();
        assert!(e.contains("router.kv.block_sise"), "{e}");
        assert!(e.contains("block_size") && e.contains("redis"), "{e}");
    }
}
