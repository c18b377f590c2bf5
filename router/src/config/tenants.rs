//! `[router.tenants.<name>]`: a tenant's API keys, its admission class, and its budgets
//! held fleet-wide through the directory (`api::tenants`).

use serde::Deserialize;

use super::ConfigError;
use crate::proxy::admission::Class;

/// One tenant as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTable {
    /// Its API keys (`Authorization: Bearer KEY` or `x-api-key`), at least one.
    pub keys: Vec<String>,
    /// Its class: the class of its requests that name none, and the highest they may ask.
    #[serde(default)]
    pub class: Option<Class>,
    /// Prompt plus completion tokens it may be admitted a minute, fleet-wide (0: no limit).
    #[serde(default)]
    pub tokens_per_minute: u64,
    /// Sessions it may have live at once, fleet-wide (0: no limit).
    #[serde(default)]
    pub max_sessions: u32,
    /// How long a session of it stays live after its last step, s.
    #[serde(default = "default_session_idle_s")]
    pub session_idle_s: u64,
}

fn default_session_idle_s() -> u64 {
    300
}

/// A tenant, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    pub name: String,
    pub class: Option<Class>,
    pub tokens_per_minute: u64,
    pub max_sessions: u32,
    pub session_idle_ms: u64,
}

/// The tenants, and each API key's tenant: `keys[i]` belongs to `tenants[of_key[i]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tenants {
    pub tenants: Vec<TenantSpec>,
    pub keys: Vec<String>,
    pub of_key: Vec<usize>,
}

/// Whether `key` may be a client API key (plain or a tenant's): at least 8 printable
/// characters, no spaces.
pub(super) fn key_is_valid(key: &str) -> bool {
    key.len() >= 8 && key.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks the tenants: names and keys as the directory and the key check take them, no key
/// twice (here or in `api_keys`).
pub fn validate(
    tables: &std::collections::BTreeMap<String, TenantTable>,
    api_keys: &[String],
) -> Result<Tenants, ConfigError> {
    let mut out = Tenants::default();
    let bad = |name: &str, why: String| ConfigError::router("tenants", format!("{name}: {why}"));
    for (name, t) in tables {
        if name.is_empty() || name.len() > ownerserve_ownership::tenant_budgets::MAX_TENANT_BYTES {
            return Err(bad(name, "a tenant's name is 1 to 128 bytes".into()));
        }
        if t.keys.is_empty() {
            return Err(bad(name, "needs at least one key".into()));
        }
        for k in &t.keys {
            if !key_is_valid(k) {
                return Err(bad(
                    name,
                    "each key must be at least 8 printable characters, without spaces".into(),
                ));
            }
            if api_keys.contains(k) || out.keys.contains(k) {
                return Err(bad(
                    name,
                    "a key belongs to one tenant, and not to api_keys".into(),
                ));
            }
            out.keys.push(k.clone());
            out.of_key.push(out.tenants.len());
        }
        out.tenants.push(TenantSpec {
            name: name.clone(),
            class: t.class,
            tokens_per_minute: t.tokens_per_minute,
            max_sessions: t.max_sessions,
            session_idle_ms: t.session_idle_s.max(1).saturating_mul(1_000),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[&str]) -> TenantTable {
        TenantTable {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            class: None,
            tokens_per_minute: 0,
            max_sessions: 0,
            session_idle_s: 300,
        }
    }

    #[test]
    fn each_key_names_its_tenant_and_a_key_belongs_to_one() {
        let mut t = std::collections::BTreeMap::new();
        t.insert("acme".to_owned(), table(&["acme-key-1", "acme-key-2"]));
        t.insert("beta".to_owned(), table(&["beta-key-1"]));
        let v = validate(&t, &["plain-key-1".to_owned()]).unwrap();
        assert_eq!(v.keys, ["acme-key-1", "acme-key-2", "beta-key-1"]);
        assert_eq!(v.of_key, [0, 0, 1]);
        assert_eq!(v.tenants[1].name, "beta");
        assert!(validate(&t, &["beta-key-1".to_owned()]).is_err());
        t.insert("gamma".to_owned(), table(&[]));
        assert!(validate(&t, &[]).is_err());
        t.insert("gamma".to_owned(), table(&["short"]));
        assert!(validate(&t, &[]).is_err());
    }
}
