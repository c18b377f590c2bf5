//! `config`: a router TOML file (and `up`'s) parsed and validated.

use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_router::config::{worker_specs, RouterConfig, RouterFile, UpFile};

use super::{tokens, JSON_TOKENS};

pub(super) fn target() -> Target {
    let seeds = [
        include_str!("../../../../../configs/router.example.toml"),
        include_str!("../../../../../configs/up.toml"),
        "[router]\npolicy = \"kv_aware\"\nport = 0\n[[workers]]\nurl = \"http://127.0.0.1:8000\"\nrole = \"decode\"\n",
    ];
    let mut dictionary = tokens(&[
        "[router]",
        "[[workers]]",
        "[sim]",
        "[[fleet]]",
        " = ",
        "\"\"",
        "0",
        "-1",
        "1e400",
        "nan",
        "inf",
        "18446744073709551616",
        "true",
        "[]",
        "{}",
        "\"\\u0000\"",
        "policy",
        "max_connections",
        "rate_limit_per_s",
        "kv_block_size",
        "url",
        "role",
        "engine",
        "directory",
        "\"remote\"",
        "\n",
    ]);
    dictionary.extend(tokens(JSON_TOKENS));
    Target {
        name: "config",
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        dictionary,
        run: Box::new(|input| {
            let Ok(text) = std::str::from_utf8(input) else {
                return Verdict::Refused;
            };
            let mut verdict = Verdict::Refused;
            if let Ok(file) = toml::from_str::<RouterFile>(text) {
                if let Ok(specs) = worker_specs(&file.workers) {
                    let _ = RouterConfig::validate(&file.router, specs);
                }
                verdict = Verdict::Accepted;
            }
            if let Ok(file) = toml::from_str::<UpFile>(text) {
                let _ = file.sim.build();
                verdict = Verdict::Accepted;
            }
            verdict
        }),
    }
}
