//! `[router.policy]`: the routing policy and its own settings, tagged by `name`, so a
//! policy's settings live with it:
//!
//! ```toml
//! [router.policy]
//! name = "kv_aware"
//! overlap_weight = 1.0
//! busy_max_waiting = 8
//! ```
//!
//! `policy = "kv_aware"` (a name alone) still reads as that policy with its defaults.

use serde::Deserialize;
use toml::{Table, Value};

/// A routing policy and its settings (`[router.policy]`), one variant per name
/// `ownerserve_planner::policy::POLICY_NAMES` lists. Settings left out keep their defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyTable {
    /// The cost planner (its settings are `[router.planner]`).
    Ownerserve {},
    RoundRobin {},
    LeastLoaded {},
    KvAware(KvAwareTable),
    SessionAffinity(SessionAffinityTable),
    StaticPd {},
    Colocated {},
    ConditionalPd {},
    DynamoKv {},
    DynamoDisagg {},
    LlmD {},
    SmgCacheAware {},
}

/// `name = "kv_aware"`: Dynamo's cost as first written, and when a worker is busy.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvAwareTable {
    /// Weight of prefill work against decode blocks (default 1.0).
    pub overlap_weight: Option<f64>,
    /// 0 takes the lowest cost; > 0 samples with softmax (default 0).
    pub temperature: Option<f64>,
    /// Busy when the engine reports this many queued requests.
    pub busy_max_waiting: Option<f64>,
    /// Busy when the engine reports this KV usage (0..1).
    pub busy_max_kv_usage: Option<f64>,
    /// Busy when the router has this many prompt tokens in flight there, not yet prefilled.
    pub busy_max_active_prefill_tokens: Option<u64>,
}

/// `name = "session_affinity"`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionAffinityTable {
    /// How long an idle session stays pinned, seconds (default 1800).
    pub ttl_s: Option<u64>,
}

impl PolicyTable {
    /// Reads a `[router.policy]` table.
    pub(super) fn from_table(table: Table) -> Result<Self, String> {
        Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| format!("router.policy: {}", e.message()))
    }

    /// The policy's name, as `--policy` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Ownerserve {} => "ownerserve",
            Self::RoundRobin {} => "round_robin",
            Self::LeastLoaded {} => "least_loaded",
            Self::KvAware(_) => "kv_aware",
            Self::SessionAffinity(_) => "session_affinity",
            Self::StaticPd {} => "static_pd",
            Self::Colocated {} => "colocated",
            Self::ConditionalPd {} => "conditional_pd",
            Self::DynamoKv {} => "dynamo_kv",
            Self::DynamoDisagg {} => "dynamo_disagg",
            Self::LlmD {} => "llm_d",
            Self::SmgCacheAware {} => "smg_cache_aware",
        }
    }

    /// The name and the settings that are set, as flat keys: (flat key, where it was
    /// written under `router.`, value).
    pub(super) fn flat_entries(&self) -> Vec<(&'static str, String, Value)> {
        let int = |v: u64| Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
        let set: Vec<(&'static str, &str, Option<Value>)> = match self {
            Self::KvAware(t) => vec![
                (
                    "kv_overlap_weight",
                    "overlap_weight",
                    t.overlap_weight.map(Value::Float),
                ),
                (
                    "kv_temperature",
                    "temperature",
                    t.temperature.map(Value::Float),
                ),
                (
                    "busy_max_waiting",
                    "busy_max_waiting",
                    t.busy_max_waiting.map(Value::Float),
                ),
                (
                    "busy_max_kv_usage",
                    "busy_max_kv_usage",
                    t.busy_max_kv_usage.map(Value::Float),
                ),
                (
                    "busy_max_active_prefill_tokens",
                    "busy_max_active_prefill_tokens",
                    t.busy_max_active_prefill_tokens.map(int),
                ),
            ],
            Self::SessionAffinity(t) => vec![("session_ttl_s", "ttl_s", t.ttl_s.map(int))],
            _ => Vec::new(),
        };
        let name = (
            "policy",
            "policy.name".to_owned(),
            Value::String(self.name().to_owned()),
        );
        std::iter::once(name)
            .chain(set.into_iter().filter_map(|(key, written, value)| {
                value.map(|v| (key, format!("policy.{written}"), v))
            }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_planner::policy::POLICY_NAMES;

    fn policy(text: &str) -> Result<PolicyTable, String> {
        PolicyTable::from_table(toml::from_str(text).map_err(|e| format!("{e}"))?)
    }

    #[test]
    fn every_policy_name_is_a_variant_of_its_own_name() {
        for name in POLICY_NAMES {
            let p = policy(&format!("name = \"{name}\"")).unwrap();
            assert_eq!(p.name(), *name);
        }
        assert!(policy("name = \"fastest\"").is_err());
        assert!(policy("overlap_weight = 1.0").is_err(), "no name");
    }

    #[test]
    fn a_policy_takes_its_own_settings_and_no_other_policys() {
        let p =
            policy("name = \"kv_aware\"\noverlap_weight = 2.0\nbusy_max_waiting = 4.0").unwrap();
        assert_eq!(
            p,
            PolicyTable::KvAware(KvAwareTable {
                overlap_weight: Some(2.0),
                busy_max_waiting: Some(4.0),
                ..KvAwareTable::default()
            })
        );
        let p = policy("name = \"session_affinity\"\nttl_s = 60").unwrap();
        assert_eq!(
            p,
            PolicyTable::SessionAffinity(SessionAffinityTable { ttl_s: Some(60) })
        );
        let e = policy("name = \"session_affinity\"\noverlap_weight = 2.0").unwrap_err();
        assert!(e.contains("overlap_weight"), "{e}");
        let e = policy("name = \"round_robin\"\nttl_s = 60").unwrap_err();
        assert!(e.contains("ttl_s"), "{e}");
    }

    #[test]
    fn only_the_settings_written_become_flat_keys() {
        let entries = policy("name = \"kv_aware\"\ntemperature = 0.5")
            .unwrap()
            .flat_entries();
        let keys: Vec<(&str, &str)> = entries.iter().map(|(k, w, _)| (*k, w.as_str())).collect();
        assert_eq!(
            keys,
            [
                ("policy", "policy.name"),
                ("kv_temperature", "policy.temperature")
            ]
        );
        assert_eq!(entries[0].2.as_str(), Some("kv_aware"));
    }
}
