//! `ownerserve up` driven by the official `openai` Python SDK, as a client would use it.
//! Needs `python3` with `openai` installed (`.ci/run` installs it).

use crate::common;

use common::{Proc, MODEL};

#[test]
fn the_openai_python_sdk_works_against_ownerserve_up() {
    let stack = Proc::up(&["--time-scale", "20"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/openai_sdk_check.py");
    let out = std::process::Command::new("python3")
        .args([script, &format!("{}/v1", stack.url), MODEL])
        .output()
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai SDK check failed (is `pip install openai` done?)\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all openai SDK checks passed"), "{stdout}");
}
