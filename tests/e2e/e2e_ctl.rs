//! `ownerserve ctl` against a running `ownerserve up`: the real binary prints tables by
//! default and the API's JSON with `--json`, takes its token from the flag or
//! `OWNERSERVE_ADMIN_TOKEN`, drains and undrains workers, explains a plan from a file or
//! stdin, and turns API errors (401, 403, 404) into a clear message and a failing exit.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{chat_body, client, temp_config, Proc, ADMIN_TOKEN, READ_TOKEN};
use serde_json::Value;

/// Runs `ownerserve ctl --url <router> <args>` with `token` in the environment (if any)
/// and `stdin`.
fn ctl(router: &str, token: Option<&str>, args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ownerserve"));
    cmd.arg("ctl")
        .args(["--url", router])
        .args(args)
        .env_remove("OWNERSERVE_ADMIN_TOKEN")
        .env("OWNERSERVE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("OWNERSERVE_ADMIN_TOKEN", t);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// stdout of a `ctl` run that must succeed.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "ctl failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// stderr of a `ctl` run that must fail.
fn failed(out: Output) -> String {
    assert!(
        !out.status.success(),
        "ctl should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

async fn chat(router: &str, session: &str, text: &str) {
    let r = client()
        .post(format!("{router}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&chat_body(text, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _: Value = r.json().await.unwrap();
}

#[tokio::test]
async fn ctl_shows_the_operator_api_as_tables_and_json_and_reports_errors() {
    let up = Proc::up(&["--instant", "true"]);
    let url = up.url.clone();
    chat(&url, "ctl-session", "hello there, agent").await;
    chat(&url, "ctl-session", "hello there, agent; now run the tests").await;
    // Ownership records are committed off the request path, the session's and its
    // prefix's in separate writes: wait for both.
    common::eventually(
        Duration::from_secs(10),
        "the session and its prefix in the directory",
        || {
            let url = url.clone();
            async move {
                let out = ctl(&url, Some(ADMIN_TOKEN), &["--json", "sessions"], "");
                let owners = ctl(&url, Some(ADMIN_TOKEN), &["owners"], "");
                out.status.success()
                    && serde_json::from_slice::<Value>(&out.stdout).unwrap()["sessions"]
                        .as_array()
                        .is_some_and(|s| !s.is_empty())
                    && owners.status.success()
                    && String::from_utf8_lossy(&owners.stdout).lines().count() >= 2
            }
        },
    )
    .await;

    let workers = ok(ctl(&url, Some(ADMIN_TOKEN), &["workers"], ""));
    let mut lines = workers.lines();
    assert_eq!(lines.next(), Some("policy: ownerserve"), "{workers}");
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("KV_USAGE"),
        "{workers}"
    );
    for name in ["prefill-0", "decode-0", "decode-1", "hybrid-0"] {
        assert!(
            workers
                .lines()
                .any(|l| l.starts_with(name) && l.contains(" yes ")),
            "{name} healthy in\n{workers}"
        );
    }
    // --json prints the API's own answer; the flag token works like the env one.
    let json: Value = serde_json::from_str(&ok(ctl(
        &url,
        None,
        &["--token", READ_TOKEN, "workers", "--json"],
        "",
    )))
    .unwrap();
    assert_eq!(json["workers"].as_array().unwrap().len(), 4);

    let sessions = ok(ctl(&url, Some(ADMIN_TOKEN), &["sessions"], ""));
    assert!(sessions.starts_with("ID"), "{sessions}");
    assert!(
        sessions.lines().any(|l| l.starts_with("ctl-session ")),
        "{sessions}"
    );
    let one = ok(ctl(
        &url,
        Some(ADMIN_TOKEN),
        &["sessions", "ctl-session"],
        "",
    ));
    assert_eq!(one.lines().count(), 2, "{one}");
    let owners = ok(ctl(&url, Some(ADMIN_TOKEN), &["owners"], ""));
    assert!(
        owners.starts_with("KEY") && owners.lines().count() >= 2,
        "{owners}"
    );
    let leases = ok(ctl(&url, Some(ADMIN_TOKEN), &["leases"], ""));
    assert_eq!(leases.lines().count(), 5, "a lease per worker:\n{leases}");
    let cluster = ok(ctl(&url, Some(ADMIN_TOKEN), &["cluster"], ""));
    assert!(
        cluster
            .lines()
            .any(|l| l.starts_with("state") && l.ends_with("Leader")),
        "{cluster}"
    );
    let cluster: Value = serde_json::from_str(&ok(ctl(
        &url,
        Some(ADMIN_TOKEN),
        &["--json", "cluster"],
        "",
    )))
    .unwrap();
    assert_eq!(cluster["leader"], 1);

    // Drain and undrain, seen by the API.
    let drained = ok(ctl(&url, Some(ADMIN_TOKEN), &["drain", "decode-1"], ""));
    assert_eq!(drained.trim(), "decode-1: draining (was not draining)");
    let json: Value = serde_json::from_str(&ok(ctl(
        &url,
        Some(ADMIN_TOKEN),
        &["workers", "--json"],
        "",
    )))
    .unwrap();
    let draining: Vec<&str> = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["draining"] == true)
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(draining, ["decode-1"]);
    let undrained = ok(ctl(&url, Some(ADMIN_TOKEN), &["undrain", "decode-1"], ""));
    assert_eq!(undrained.trim(), "decode-1: not draining (was draining)");

    // Explain, from a file and from stdin.
    let body = chat_body("hello there, agent; now run the tests and explain", 4).to_string();
    let file = temp_config("ctl-explain.json", &body);
    let plan = ok(ctl(
        &url,
        Some(ADMIN_TOKEN),
        &["explain", "--file", &file, "--session", "ctl-session"],
        "",
    ));
    assert!(plan.starts_with("class:"), "{plan}");
    assert_eq!(
        plan.lines().filter(|l| l.starts_with('*')).count(),
        1,
        "one chosen candidate:\n{plan}"
    );
    let plan: Value = serde_json::from_str(&ok(ctl(
        &url,
        Some(ADMIN_TOKEN),
        &["explain", "--json", "--session", "ctl-session"],
        &body,
    )))
    .unwrap();
    assert_eq!(plan["inputs"]["session"], "ctl-session");
    assert!(plan["candidates"].as_array().is_some_and(|c| !c.is_empty()));

    // Errors: no token, a read token on a write, an unknown session or worker.
    let err = failed(ctl(&url, None, &["workers"], ""));
    assert!(
        err.contains("401") && err.contains("OWNERSERVE_ADMIN_TOKEN"),
        "{err}"
    );
    let err = failed(ctl(&url, Some(READ_TOKEN), &["drain", "decode-0"], ""));
    assert!(err.contains("403") && err.contains("only read"), "{err}");
    let err = failed(ctl(&url, Some(ADMIN_TOKEN), &["sessions", "nope"], ""));
    assert!(
        err.contains("404") && err.contains("no session nope"),
        "{err}"
    );
    let err = failed(ctl(&url, Some(ADMIN_TOKEN), &["drain", "nobody"], ""));
    assert!(err.contains("404") && err.contains("nobody"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
}
