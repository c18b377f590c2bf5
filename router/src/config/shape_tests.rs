//! The `[router]` sub-tables: each loads into the same settings as its flat form, each
//! deprecated flat key loads with one note naming its new key, a setting written both ways
//! is refused, and every shipped config loads in the new shape.

use super::shape::{MOVED, MOVED_TO_POLICY, NESTED_ONLY};
use super::*;
use ownerserve_planner::ids::{EngineKind, Role};

const FLAT: &str = include_str!("testdata/flat.toml");
const NESTED: &str = include_str!("testdata/nested.toml");

/// The `[router]` table of a file's text, as a TOML table.
fn router_table(text: &str) -> toml::Table {
    let file: toml::Table = toml::from_str(text).unwrap();
    match file.get("router") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => panic!("no [router] table"),
    }
}

/// `table` as a router file's `[router]` table, read.
fn load(table: toml::Table) -> Result<RouterSettings, String> {
    let mut file = toml::Table::new();
    file.insert("router".to_owned(), toml::Value::Table(table));
    let text = toml::to_string(&file).map_err(|e| e.to_string())?;
    toml::from_str::<RouterFile>(&text)
        .map(|f| f.router)
        .map_err(|e| e.to_string())
}

/// Two workers, `a` and `b` (the names `planner_links` uses).
fn two_workers() -> Vec<WorkerSpec> {
    ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            WorkerSpec::new(
                name,
                &format!("http://127.0.0.1:{}", i + 1),
                Role::Hybrid,
                EngineKind::Sim,
            )
        })
        .collect()
}

#[test]
fn the_flat_fixture_sets_every_key_that_moved_and_none_at_its_default() {
    let flat = router_table(FLAT);
    let mut keys: Vec<&str> = flat.keys().map(String::as_str).collect();
    keys.retain(|k| *k != "policy");
    let mut moved: Vec<&str> = MOVED.iter().map(|(f, _)| *f).collect();
    // One policy's settings at a time: session_affinity's has its own test.
    moved.extend(
        MOVED_TO_POLICY
            .iter()
            .filter(|(_, p, _)| *p == "kv_aware")
            .map(|(f, _, _)| *f),
    );
    keys.sort_unstable();
    moved.sort_unstable();
    assert_eq!(keys, moved);
    let defaults = RouterSettings::default();
    let settings = load(flat.clone()).unwrap();
    for key in flat.keys() {
        let mut one = toml::Table::new();
        one.insert(key.clone(), flat[key].clone());
        let mut s = load(one).unwrap();
        s.deprecated.clear();
        assert_ne!(s, defaults, "{key} is at its default in the fixture");
    }
    assert_ne!(settings, defaults);
}

#[test]
fn the_sub_tables_load_into_the_same_settings_as_the_flat_keys() {
    let mut flat = load(router_table(FLAT)).unwrap();
    let nested = load(router_table(NESTED)).unwrap();
    assert!(nested.deprecated.is_empty(), "{:?}", nested.deprecated);
    assert_eq!(flat.deprecated.len(), router_table(FLAT).len() - 1);
    flat.deprecated.clear();
    assert_eq!(flat, nested);
    let a = RouterConfig::validate(&flat, two_workers()).unwrap();
    let b = RouterConfig::validate(&nested, two_workers()).unwrap();
    assert_eq!(format!("{:?}", a.planner), format!("{:?}", b.planner));
    assert_eq!(a.directory, b.directory);
}

#[test]
fn each_sub_table_alone_loads_as_its_flat_keys() {
    let flat = router_table(FLAT);
    for (section, value) in router_table(NESTED) {
        let mut nested = toml::Table::new();
        nested.insert(section.clone(), value);
        let keys: Vec<&str> = if section == "policy" {
            let mut k: Vec<&str> = MOVED_TO_POLICY
                .iter()
                .filter(|(_, p, _)| *p == "kv_aware")
                .map(|(f, _, _)| *f)
                .collect();
            k.push("policy");
            k
        } else {
            MOVED
                .iter()
                .filter(|(_, p)| p.split('.').next() == Some(section.as_str()))
                .map(|(f, _)| *f)
                .collect()
        };
        assert!(!keys.is_empty(), "{section}");
        let flat_part: toml::Table = keys
            .iter()
            .map(|k| ((*k).to_owned(), flat[*k].clone()))
            .collect();
        let mut from_flat = load(flat_part).unwrap();
        from_flat.deprecated.clear();
        assert_eq!(load(nested).unwrap(), from_flat, "[router.{section}]");
    }
}

#[test]
fn each_deprecated_key_loads_with_one_note_naming_its_new_key() {
    let flat = router_table(FLAT);
    let mut affinity = toml::Table::new();
    affinity.insert("session_ttl_s".to_owned(), toml::Value::Integer(60));
    for (key, value) in flat.iter().chain(&affinity) {
        if key == "policy" {
            continue;
        }
        let mut one = toml::Table::new();
        one.insert(key.clone(), value.clone());
        let s = load(one).unwrap();
        let new = MOVED
            .iter()
            .find(|(f, _)| f == key)
            .map(|(_, p)| format!("router.{p}"))
            .or_else(|| {
                MOVED_TO_POLICY
                    .iter()
                    .find(|(f, _, _)| f == key)
                    .map(|(_, _, k)| format!("router.policy.{k}"))
            })
            .unwrap();
        assert_eq!(s.deprecated.len(), 1, "{key}: {:?}", s.deprecated);
        let note = &s.deprecated[0];
        assert!(
            note.starts_with(&format!("router.{key} is deprecated: use {new}")),
            "{note}"
        );
    }
    assert_eq!(
        load(affinity).unwrap().deprecated,
        ["router.session_ttl_s is deprecated: use router.policy.ttl_s (with name = \"session_affinity\")"]
    );
}

#[test]
fn the_keys_that_did_not_move_leave_no_note() {
    let s: RouterFile = toml::from_str(
        "[router]\nhost = \"0.0.0.0\"\nport = 9000\npolicy = \"least_loaded\"\n\
         worker_threads = 2\nbusy_poll_us = 0\nlog_format = \"json\"\n",
    )
    .unwrap();
    assert!(s.router.deprecated.is_empty(), "{:?}", s.router.deprecated);
    assert_eq!(s.router.policy, "least_loaded");
    assert_eq!(s.router.port, 9000);
}

#[test]
fn a_policy_table_sets_its_own_settings() {
    let s: RouterFile =
        toml::from_str("[router.policy]\nname = \"session_affinity\"\nttl_s = 60\n").unwrap();
    assert_eq!(s.router.policy, "session_affinity");
    assert_eq!(s.router.session_ttl_s, 60);
    assert!(s.router.deprecated.is_empty());
    let s: RouterFile = toml::from_str("[router.policy]\nname = \"ownerserve\"\n").unwrap();
    assert_eq!(s.router.policy, "ownerserve");
    let e = toml::from_str::<RouterFile>("[router.policy]\nname = \"ownerserve\"\nttl_s = 60\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ttl_s"), "{e}");
    let e = toml::from_str::<RouterFile>("[router.policy]\nname = \"fastest\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("fastest"), "{e}");
}

#[test]
fn a_setting_written_both_ways_is_refused_naming_both() {
    let flat = router_table(FLAT);
    let nested = router_table(NESTED);
    for (section, value) in &nested {
        let toml::Value::Table(sub) = value else {
            continue;
        };
        for key in sub.keys() {
            let path = format!("{section}.{key}");
            let Some(flat_key) = MOVED
                .iter()
                .find(|(_, p)| *p == path)
                .map(|(f, _)| *f)
                .or_else(|| {
                    MOVED_TO_POLICY
                        .iter()
                        .find(|(_, _, k)| section == "policy" && k == key)
                        .map(|(f, _, _)| *f)
                })
            else {
                continue; // `policy.name`, `kv.redis`, `prompt.tokenizers`'s parent...
            };
            if flat_key == section {
                continue; // `directory = "..."` and `[router.directory]` are one TOML key
            }
            let mut both = toml::Table::new();
            both.insert(section.clone(), value.clone());
            both.insert(flat_key.to_owned(), flat[flat_key].clone());
            let e = load(both).unwrap_err();
            assert!(
                e.contains(&format!("router.{flat_key} and router.{path}"))
                    && e.contains("set twice"),
                "{path}: {e}"
            );
        }
    }
    let e = toml::from_str::<RouterFile>(
        "[router]\nkv_redis_url = \"redis://a\"\n[router.kv.redis]\nurl = \"redis://b\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("router.kv_redis_url and router.kv.redis.url"),
        "{e}"
    );
}

#[test]
fn every_shipped_config_loads_in_the_new_shape() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Tokenizer directories and model files are the operator's (paths relative to
        // where the router runs): the rest of each file is validated.
        let without_files = |r: &RouterSettings| RouterSettings {
            tokenizers: Default::default(),
            models: Default::default(),
            ..r.clone()
        };
        let router = if text.contains("[[fleet]]") {
            let up: UpFile = read_toml(&path).unwrap();
            up.sim.build().unwrap();
            RouterConfig::validate(&without_files(&up.router), two_workers()).unwrap();
            up.router
        } else {
            let file: RouterFile = read_toml(&path).unwrap();
            RouterConfig::validate_with(
                &without_files(&file.router),
                worker_specs(&file.workers).unwrap(),
                &file.kubernetes,
            )
            .unwrap();
            file.router
        };
        assert!(
            router.deprecated.is_empty(),
            "{}: {:?}",
            path.display(),
            router.deprecated
        );
        seen += 1;
    }
    assert!(seen >= 4, "{seen} configs in {}", dir.display());
    for dir in ["models", "gpus"] {
        for entry in std::fs::read_dir(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../configs")
                .join(dir),
        )
        .unwrap()
        {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let loaded = if dir == "models" {
                ownerserve_planner::spec::ModelSpec::from_toml(&text).map(drop)
            } else {
                ownerserve_planner::spec::GpuSpec::from_toml(&text).map(drop)
            };
            assert!(loaded.is_ok(), "{}: {loaded:?}", path.display());
        }
    }
}

#[test]
fn every_router_key_is_documented_in_docs_config_md_under_its_table() {
    let doc = include_str!("../../../docs/CONFIG.md");
    let table_of = |heading: &str| -> &str {
        let start = doc
            .find(&format!("## `[{heading}]`\n"))
            .unwrap_or_else(|| panic!("no ## `[{heading}]` in docs/CONFIG.md"));
        let rest = &doc[start + 1..];
        &rest[..rest.find("\n## ").unwrap_or(rest.len())]
    };
    for key in [
        "host",
        "port",
        "worker_threads",
        "busy_poll_us",
        "log_format",
    ] {
        assert!(
            table_of("router").contains(&format!("| `{key}` |")),
            "{key}"
        );
    }
    for (flat, path) in MOVED {
        let (section, leaf) = path.split_once('.').unwrap();
        let row = format!("| `{leaf}` | `{flat}` |");
        assert!(
            table_of(&format!("router.{section}")).contains(&row),
            "{row} not under [router.{section}]"
        );
    }
    for (_, path) in NESTED_ONLY {
        let (section, leaf) = path.split_once('.').unwrap();
        let row = format!("| `{leaf}` | — |");
        assert!(
            table_of(&format!("router.{section}")).contains(&row),
            "{row} not under [router.{section}]"
        );
    }
    let policy = table_of("router.policy");
    assert!(policy.contains("| `name` | `policy` |"));
    for (flat, name, key) in MOVED_TO_POLICY {
        let row = format!("| `{key}` (`name = \"{name}\"`) | `{flat}` |");
        assert!(policy.contains(&row), "{row}");
    }
    for name in ownerserve_planner::policy::POLICY_NAMES {
        assert!(policy.contains(&format!("`{name}`")), "policy {name}");
    }
}

/// A log sink for [`the_deprecated_keys_are_logged_once_each_as_warnings`].
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_deprecated_keys_are_logged_once_each_as_warnings() {
    let file: RouterFile = toml::from_str(
        "[router]\nport = 9000\nmax_body_bytes = 4096\nkv_block_size = 32\n\
         [router.limits]\nmax_choices = 4\n",
    )
    .unwrap();
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || file.router.warn_deprecated());
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines.iter().all(|l| l.contains("WARN")), "{text}");
    assert!(text.contains("router.kv_block_size is deprecated: use router.kv.block_size"));
    assert!(text.contains("router.max_body_bytes is deprecated: use router.limits.max_body_bytes"));
}

#[test]
fn the_flags_override_the_sub_tables_as_they_did_the_flat_keys() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        overrides: RouterOverrides,
    }
    use clap::Parser;
    let cli = Cli::try_parse_from([
        "ownerserve",
        "--host=0.0.0.0",
        "--port=9",
        "--policy=round_robin",
        "--admin-token=admin-flag-0123",
        "--read-token=read-flag-0123",
        "--worker-threads=3",
        "--busy-poll-us=7",
        "--directory-secret=flag-secret-0123456789",
        "--api-keys=flag-key-0001,flag-key-0002",
        "--engine-api-key=flag-engine-key",
    ])
    .unwrap();
    let mut from_nested = load(router_table(NESTED)).unwrap();
    let mut from_flat = load(router_table(FLAT)).unwrap();
    from_flat.deprecated.clear();
    for s in [&mut from_nested, &mut from_flat] {
        cli.overrides.apply(s);
        assert_eq!(s.host.to_string(), "0.0.0.0");
        assert_eq!((s.port, s.policy.as_str()), (9, "round_robin"));
        assert_eq!(s.admin_token.as_deref(), Some("admin-flag-0123"));
        assert_eq!(s.read_token.as_deref(), Some("read-flag-0123"));
        assert_eq!((s.worker_threads, s.busy_poll_us), (3, 7));
        assert_eq!(
            s.directory_secret.as_deref(),
            Some("flag-secret-0123456789")
        );
        assert_eq!(s.api_keys, ["flag-key-0001", "flag-key-0002"]);
        assert_eq!(s.engine_api_key.as_deref(), Some("flag-engine-key"));
        // The file's kv_aware settings stay, unused by the policy the flag chose.
        assert_eq!(s.kv_overlap_weight, 2.0);
    }
    assert_eq!(from_nested, from_flat);
}

#[test]
fn the_new_session_keys_load_only_from_their_sub_table() {
    let s = load(router_table(
        "[router.sessions]\nlifecycle = true\ngap_prior_median_s = 2.0\ngap_prior_p90_s = 90.0\nreturn_priority = false\nadmission = true\nadmission_max_wait_ms = 500\n",
    ))
    .unwrap();
    assert!(s.session_lifecycle && !s.session_return_priority);
    assert!(s.session_admission && s.session_admission_max_wait_ms == 500);
    assert_eq!(
        (s.session_gap_prior_median_s, s.session_gap_prior_p90_s),
        (2.0, 90.0)
    );
    assert!(s.deprecated.is_empty());
    let flat = load(router_table("[router]\nsession_lifecycle = true\n")).unwrap_err();
    assert!(flat.contains("router.sessions.lifecycle"), "{flat}");
}

#[test]
fn the_retention_keys_load_only_from_router_directory_and_default_to_600_s() {
    let s = load(router_table(
        "[router.directory]\nartifact_retention_s = 1\nsession_retention_s = 0\n",
    ))
    .unwrap();
    assert_eq!(
        (
            s.directory_artifact_retention_s,
            s.directory_session_retention_s
        ),
        (1, 0)
    );
    assert!(s.deprecated.is_empty());
    let defaults = RouterSettings::default();
    assert_eq!(
        (
            defaults.directory_artifact_retention_s,
            defaults.directory_session_retention_s
        ),
        (600, 600)
    );
    let c = RouterConfig::validate(&s, two_workers()).unwrap();
    assert_eq!(
        c.retention,
        Retention {
            artifact: std::time::Duration::from_secs(1),
            session: std::time::Duration::ZERO,
        }
    );
    let flat = load(router_table(
        "[router]\ndirectory_artifact_retention_s = 1\n",
    ))
    .unwrap_err();
    assert!(
        flat.contains("router.directory.artifact_retention_s"),
        "{flat}"
    );
}
