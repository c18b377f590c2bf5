//! Config parsing and validation: the shipped configs load, overrides win, and bad values
//! are refused with the key named.

use super::*;
use ownerserve_planner::ids::{EngineKind, Role, WorkerId};

/// One decode worker of `engine` on 127.0.0.1:1, named `a`.
fn one_decoder(engine: EngineKind) -> Vec<WorkerSpec> {
    vec![WorkerSpec::new(
        "a",
        "http://127.0.0.1:1",
        Role::Decode,
        engine,
    )]
}

#[test]
fn the_embedded_up_config_parses_and_validates() {
    let up: UpFile = toml::from_str(DEFAULT_UP_TOML).unwrap();
    assert!(up.fleet.iter().map(|g| g.count).sum::<u32>() >= 3);
    up.sim.build().unwrap();
    RouterConfig::validate(
        &up.router,
        vec![WorkerSpec::new(
            "a",
            "http://127.0.0.1:1",
            Role::Decode,
            EngineKind::Sim,
        )],
    )
    .unwrap();
}

#[test]
fn the_example_router_config_parses() {
    let file: RouterFile =
        toml::from_str(include_str!("../../../configs/router.example.toml")).unwrap();
    let specs = worker_specs(&file.workers).unwrap();
    RouterConfig::validate(&file.router, specs).unwrap();
}

#[test]
fn worker_flags_parse_and_bad_ones_are_named() {
    let w = parse_worker_flag("http://10.0.0.1:8000/,role=decode,engine=sglang,name=d1").unwrap();
    assert_eq!(w.role, Role::Decode);
    assert_eq!(w.engine, EngineKind::Sglang);
    let specs = worker_specs(&[w]).unwrap();
    assert_eq!(specs[0].base_url, "http://10.0.0.1:8000");
    assert!(parse_worker_flag("http://x:1,role=chef").is_err());
    assert!(worker_specs(&[parse_worker_flag("ftp://x:1").unwrap()]).is_err());
    assert!(worker_specs(&[parse_worker_flag("http://x:1/v1").unwrap()]).is_err());
}

#[test]
fn errors_name_the_section_and_key() {
    let bad = |s: RouterSettings| {
        let one = one_decoder(EngineKind::Sim);
        RouterConfig::validate(&s, one).unwrap_err().to_string()
    };
    let d = RouterSettings::default;
    assert_eq!(
        bad(RouterSettings {
            kv_block_size: Some(0),
            ..d()
        }),
        "router.kv_block_size: must be in 1..=1024"
    );
    assert_eq!(
        bad(RouterSettings {
            health_timeout_ms: 0,
            ..d()
        }),
        "router.health_timeout_ms: must be positive"
    );
    for headroom in [-0.1, 0.95, f64::NAN] {
        assert_eq!(
            bad(RouterSettings {
                session_admission_headroom: headroom,
                ..d()
            }),
            "router.sessions.admission_headroom: must be a share from 0 to 0.9"
        );
    }
    assert_eq!(
        bad(RouterSettings {
            kv_redis_url: Some("http://r".into()),
            ..d()
        }),
        "router.kv_redis_url: `http://r` must start with redis://"
    );
    assert!(bad(RouterSettings {
        planner_gpu: "abacus".into(),
        ..d()
    })
    .starts_with("router.planner_gpu: "));
    let flag = parse_worker_flag("http://x:1,rol=decode")
        .unwrap_err()
        .to_string();
    assert!(
        flag.starts_with("--worker `http://x:1,rol=decode`: unknown key `rol`"),
        "{flag}"
    );
    let named = worker_specs(&[parse_worker_flag("http://x:1/v1,name=d7").unwrap()]).unwrap_err();
    assert_eq!(
        named.to_string(),
        "workers.d7.url: url `http://x:1/v1` must not have a path"
    );
}

#[test]
fn unknown_policy_and_keys_are_refused() {
    let s = RouterSettings {
        policy: "magic".into(),
        ..RouterSettings::default()
    };
    let one = one_decoder(EngineKind::Sim);
    let err = RouterConfig::validate(&s, one).unwrap_err().to_string();
    assert!(
        err.contains("magic") && err.contains("round_robin"),
        "{err}"
    );
    assert!(toml::from_str::<RouterFile>("[router]\nprot = 1").is_err());
}

#[test]
fn overrides_win_over_the_file() {
    let mut s = RouterSettings::default();
    RouterOverrides {
        host: None,
        port: Some(9),
        policy: Some("least_loaded".into()),
        admin_token: Some("t".into()),
        read_token: None,
        worker_threads: Some(4),
        busy_poll_us: Some(0),
        directory_secret: Some("0123456789abcdef".into()),
        api_keys: Some(vec!["key-one-1".into(), "key-two-2".into()]),
        engine_api_key: None,
    }
    .apply(&mut s);
    assert_eq!(s.admin_token.as_deref(), Some("t"));
    assert_eq!(s.directory_secret.as_deref(), Some("0123456789abcdef"));
    assert_eq!(s.api_keys, ["key-one-1", "key-two-2"]);
    assert_eq!((s.port, s.policy.as_str()), (9, "least_loaded"));
    assert_eq!(s.worker_threads, 4);
    assert_eq!(s.busy_poll_us, 0, "the default polls for 200 µs");
}

#[test]
fn a_model_tokenizer_is_loaded_at_startup_and_a_missing_one_is_named() {
    let one = || one_decoder(EngineKind::Sim);
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../workers-shim/tests/fixtures/tokenizers/local"
    );
    let s = RouterSettings {
        tokenizers: [
            ("tiny".to_owned(), dir.to_owned()),
            ("m".to_owned(), "builtin".to_owned()),
        ]
        .into(),
        ..RouterSettings::default()
    };
    let cfg = RouterConfig::validate(&s, one()).unwrap();
    assert_eq!(cfg.tokenizers.keys().collect::<Vec<_>>(), ["tiny"]);
    let s = RouterSettings {
        tokenizers: [("e".to_owned(), "engine".to_owned())].into(),
        ..RouterSettings::default()
    };
    let cfg = RouterConfig::validate(&s, one()).unwrap();
    assert!(matches!(cfg.tokenizers["e"], ModelTokenizer::Engine));
    let s = RouterSettings {
        tokenizers: [("tiny".to_owned(), "/nonexistent/model".to_owned())].into(),
        ..RouterSettings::default()
    };
    let err = RouterConfig::validate(&s, one()).unwrap_err().to_string();
    assert!(
        err.starts_with("router.tokenizers.tiny: cannot read /nonexistent/model/tokenizer.json: "),
        "{err}"
    );
}

#[test]
fn the_vllm_example_config_parses() {
    let file: RouterFile =
        toml::from_str(include_str!("../../../configs/vllm.example.toml")).unwrap();
    assert_eq!(file.router.kv_block_size, Some(32));
    assert_eq!(file.router.tokenizers["tiny"], "/tmp/vllm-tiny-llama");
    assert_eq!(file.workers.len(), 2);
}

#[test]
fn the_sglang_example_config_parses_and_probes_ready() {
    let file: RouterFile =
        toml::from_str(include_str!("../../../configs/sglang.example.toml")).unwrap();
    assert_eq!(file.router.kv_block_size, Some(16));
    assert_eq!(file.workers.len(), 2);
    let specs = worker_specs(&file.workers).unwrap();
    assert!(specs
        .iter()
        .all(|w| w.engine == EngineKind::Sglang && w.probe_path() == "/ready"));
}

#[test]
fn health_path_and_capacity_are_worker_keys() {
    let w = parse_worker_flag(
        "http://127.0.0.1:1,engine=sglang,health_path=/health,kv_capacity_tokens=4096",
    )
    .unwrap();
    let spec = &worker_specs(&[w]).unwrap()[0];
    assert_eq!(spec.probe_path(), "/health");
    assert_eq!(spec.kv_capacity_tokens, Some(4096));
    let vllm = WorkerSpec::new("v", "http://127.0.0.1:1", Role::Hybrid, EngineKind::Vllm);
    assert_eq!(vllm.probe_path(), "/health");
    let bad = WorkerSpec {
        health_path: Some("ready".into()),
        ..vllm.clone()
    };
    let err = RouterConfig::validate(&RouterSettings::default(), vec![bad])
        .unwrap_err()
        .to_string();
    assert!(err.contains("v.health_path: must start with /"), "{err}");
    let zero = WorkerSpec {
        kv_capacity_tokens: Some(0),
        ..vllm
    };
    let err = RouterConfig::validate(&RouterSettings::default(), vec![zero])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("v.kv_capacity_tokens: must be positive"),
        "{err}"
    );
}

#[test]
fn each_served_model_is_priced_with_its_own_spec() {
    let one = || one_decoder(EngineKind::Vllm);
    let tiny = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/models/tiny-llama-cpu.toml"
    );
    let settings = RouterSettings {
        planner_model: "qwen3-30b-a3b".into(),
        models: [
            ("tiny".to_owned(), tiny.to_owned()),
            ("my-llama".to_owned(), "llama-3.1-8b".to_owned()),
        ]
        .into(),
        ..RouterSettings::default()
    };
    let cfg = RouterConfig::validate(&settings, one()).unwrap();
    let priced = |served: &str| cfg.planner.model_for(served).name.clone();
    assert_eq!(priced("tiny"), "tiny-llama-cpu");
    assert_eq!(priced("my-llama"), "Llama-3.1-8B");
    // A preset's own served name needs no entry.
    assert_eq!(priced("deepseek-ai/DeepSeek-V3"), "DeepSeek-V3");
    // Anything else: router.planner_model (and a warning at startup).
    assert_eq!(priced("something-else"), "Qwen3-30B-A3B");
    let bad = RouterSettings {
        models: [("tiny".to_owned(), "no-such-preset".to_owned())].into(),
        ..RouterSettings::default()
    };
    let err = RouterConfig::validate(&bad, one()).unwrap_err().to_string();
    assert!(err.starts_with("router.models.tiny: "), "{err}");
}

/// The planner prices each worker's prefills in its engine's step budget: the worker's
/// `max_num_batched_tokens`, else the router's, else vLLM's default for the worker's GPU;
/// and capped per request by the worker's `long_prefill_token_threshold`, else the
/// router's, else not at all.
#[test]
fn each_worker_s_step_budget_reaches_the_planner() {
    let flag = |f: &str| {
        worker_specs(&[parse_worker_flag(f).unwrap()])
            .unwrap()
            .remove(0)
    };
    let workers = || {
        vec![
            WorkerSpec {
                name: "own".into(),
                ..flag("http://127.0.0.1:1,max_num_batched_tokens=1024,long_prefill_token_threshold=256")
            },
            WorkerSpec {
                name: "a100".into(),
                ..flag("http://127.0.0.1:2,gpu=a100")
            },
            WorkerSpec {
                name: "plain".into(),
                ..flag("http://127.0.0.1:3")
            },
        ]
    };
    let cfg = RouterConfig::validate(&RouterSettings::default(), workers()).unwrap();
    let budget = |cfg: &RouterConfig, i: u32| {
        let b = cfg.planner.step_budget_of(WorkerId(i));
        (b.tokens, b.long_prefill_cap)
    };
    assert_eq!(
        (budget(&cfg, 0), budget(&cfg, 1), budget(&cfg, 2)),
        ((1_024, 256), (2_048, 0), (8_192, 0))
    );
    let set = RouterSettings {
        planner_max_num_batched_tokens: Some(4_096),
        planner_long_prefill_token_threshold: Some(512),
        ..RouterSettings::default()
    };
    let cfg = RouterConfig::validate(&set, workers()).unwrap();
    assert_eq!(
        (budget(&cfg, 0), budget(&cfg, 1), budget(&cfg, 2)),
        ((1_024, 256), (4_096, 512), (4_096, 512))
    );
    let zero = WorkerSpec {
        max_num_batched_tokens: Some(0),
        ..workers().remove(2)
    };
    let err = RouterConfig::validate(&RouterSettings::default(), vec![zero])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("plain.max_num_batched_tokens: must be positive"),
        "{err}"
    );
}

/// `planner_migration_budget` reaches the planner's weights: 0.1 by default, `inf` is no
/// budget, and a negative or NaN share is refused.
#[test]
fn the_migration_budget_reaches_the_planner() {
    let one = || one_decoder(EngineKind::Vllm);
    let cfg = RouterConfig::validate(&RouterSettings::default(), one()).unwrap();
    assert_eq!(cfg.planner.weights.migration_budget, 0.1);
    for share in [0.0, 0.25, f64::INFINITY] {
        let set = RouterSettings {
            planner_migration_budget: share,
            ..RouterSettings::default()
        };
        let cfg = RouterConfig::validate(&set, one()).unwrap();
        assert_eq!(cfg.planner.weights.migration_budget, share);
    }
    // TOML writes no budget as `inf`.
    let off: RouterFile = toml::from_str("[router]\nplanner_migration_budget = inf").unwrap();
    assert_eq!(off.router.planner_migration_budget, f64::INFINITY);
    for bad in [-0.1, f64::NAN, f64::NEG_INFINITY] {
        let s = RouterSettings {
            planner_migration_budget: bad,
            ..RouterSettings::default()
        };
        let err = RouterConfig::validate(&s, one()).unwrap_err().to_string();
        assert!(err.contains("planner_migration_budget"), "{err}");
    }
}

/// The planner prices a move's held answer for the read lease of a remote directory, the
/// hold `claim::settle_move` applies; nothing with a directory only this router reads.
#[test]
fn a_remote_directory_s_read_lease_is_the_hold_the_planner_prices_a_move_for() {
    let one = || one_decoder(EngineKind::Vllm);
    let embedded = RouterConfig::validate(&RouterSettings::default(), one()).unwrap();
    assert_eq!(embedded.planner.move_hold_s, 0.0);
    let remote = RouterSettings {
        directory: DirectoryMode::Remote,
        directory_urls: vec!["http://127.0.0.1:1".to_owned()],
        read_lease_ms: 250,
        ..RouterSettings::default()
    };
    let cfg = RouterConfig::validate(&remote, one()).unwrap();
    assert_eq!(cfg.planner.move_hold_s, 0.25);
}
