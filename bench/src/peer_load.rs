//! The load of `bench proxy --peers`: chat bodies of a given size, the `wrk` Lua scripts
//! that send them (one fixed body, or agent sessions whose every step is the previous
//! prompt plus ~2 KB under an `x-session-id`), and one `wrk` run read into figures.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The model every body names (the static backends list it).
pub const MODEL: &str = "m";

/// Steps of one agent session after its first; then the slot starts a new session.
pub const SESSION_STEPS: usize = 16;

/// Bytes one session step adds (an assistant turn and a user turn).
const STEP_BYTES: usize = 2048;

/// What a run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The same body every time, no session.
    Stateless,
    /// Agent sessions: each step the previous prompt plus ~2 KB, `x-session-id` set.
    Sessions,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Stateless => "stateless",
            Mode::Sessions => "sessions",
        }
    }
}

/// A deterministic word stream like a long agent prompt: `tokNNNN` words (the DeepSeek-V4
/// tokenizer makes ~40K tokens of 171 KB of them), seeded (so sessions differ).
pub(crate) fn words(bytes: usize, seed: u64) -> String {
    let mut out = String::with_capacity(bytes + 16);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < bytes {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let _ = write!(out, "tok{} ", x % 5000);
    }
    out.truncate(bytes);
    out
}

const HEAD: &str = r#"{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":""#;

/// A chat body of `bytes` bytes (within a few) with one long user message.
pub fn chat_body(bytes: usize) -> String {
    let tail = r#""}]}"#;
    let room = bytes.saturating_sub(HEAD.len() + tail.len());
    format!("{HEAD}{}{tail}", words(room, bytes as u64))
}

/// The `wrk` script for `mode` with bodies of `bytes`, written under `dir`; `conns`
/// sessions run side by side.
pub fn script(dir: &Path, mode: Mode, bytes: usize, conns: u32) -> anyhow::Result<PathBuf> {
    let lua = dir.join(format!("{}-{bytes}-c{conns}.lua", mode.name()));
    let text = match mode {
        Mode::Stateless => {
            let body = dir.join(format!("body-{bytes}.json"));
            std::fs::write(&body, chat_body(bytes))?;
            format!(
                "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
                 local f = assert(io.open(\"{}\", \"rb\"))\nwrk.body = f:read(\"*a\")\nf:close()\n",
                body.display()
            )
        }
        Mode::Sessions => session_script(dir, bytes, conns)?,
    };
    std::fs::write(&lua, text)?;
    Ok(lua)
}

/// Agent sessions: slot `i` of `conns` sends its session's steps in turn; step `k` is the
/// first prompt (`bytes`) plus `k` turns of ~2 KB. The run id (wrk's first script
/// argument) keeps sessions of different runs apart.
fn session_script(dir: &Path, bytes: usize, conns: u32) -> anyhow::Result<String> {
    let base = dir.join(format!("base-{bytes}.txt"));
    let room = bytes.saturating_sub(HEAD.len() + 4 + 16);
    std::fs::write(&base, words(room, bytes as u64))?;
    let steps = dir.join("steps.txt");
    let mut lines = String::new();
    for k in 1..=SESSION_STEPS {
        let _ = writeln!(
            lines,
            r#",{{"role":"assistant","content":"step {k} done"}},{{"role":"user","content":"{}"}}"#,
            words(STEP_BYTES - 80, 7_000 + k as u64)
        );
    }
    std::fs::write(&steps, lines)?;
    Ok(format!(
        r#"wrk.method = "POST"
local f = assert(io.open("{base}", "rb")); local base = f:read("*a"); f:close()
local steps = {{}}
local acc = ""
for line in io.lines("{steps}") do acc = acc .. line; steps[#steps + 1] = acc end
local head = '{HEAD}'
local nslots, slots, n, run = {conns}, {{}}, 0, "r"
function init(args) run = args[1] or "r" end
function request()
  n = n + 1
  local i = n % nslots + 1
  local s = slots[i]
  if s == nil or s.step > #steps then
    s = {{gen = (s and s.gen or 0) + 1, step = 0}}; slots[i] = s
  end
  local sid = run .. "-" .. i .. "-" .. s.gen
  local body = head .. "session " .. sid .. ": " .. base .. '"}}' .. (steps[s.step] or "") .. "]}}"
  s.step = s.step + 1
  return wrk.format(nil, nil, {{["Content-Type"] = "application/json", ["x-session-id"] = sid}}, body)
end
"#,
        base = base.display(),
        steps = steps.display(),
    ))
}

/// One `wrk` run's figures.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Answers that were not 2xx (a router refusing or failing under load).
    pub non_2xx: u64,
}

/// wrk's duration (`210.00us`, `1.50ms`, `2.00s`) in microseconds.
pub fn parse_duration_us(s: &str) -> Option<f64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v,
        "ms" => v * 1e3,
        "s" => v * 1e6,
        "m" => v * 60e6,
        _ => return None,
    })
}

/// One `wrk` run (one thread, on `cpu` when given) of `secs` against `url`.
pub fn wrk(
    cpu: Option<u32>,
    url: &str,
    lua: &Path,
    conns: u32,
    secs: u64,
    run_id: &str,
) -> anyhow::Result<Measured> {
    let mut cmd = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string(), "wrk"]);
            c
        }
        None => Command::new("wrk"),
    };
    let out = cmd
        .args(["--latency", "-t1", "-c", &conns.to_string()])
        .args(["-d", &format!("{secs}s"), "--timeout", "10s", "-s"])
        .arg(lua)
        .args([url, "--", run_id])
        .output()
        .context("cannot run wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse_wrk(&text)
}

/// Reads req/s, p50, p99 and non-2xx answers from wrk's `--latency` output.
pub fn parse_wrk(text: &str) -> anyhow::Result<Measured> {
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_owned()))
    };
    let rps = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no Requests/sec in wrk output:\n{text}"))?;
    let non_2xx = field("Non-2xx or 3xx responses:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let p50 = field("50%").and_then(|v| parse_duration_us(&v));
    let p99 = field("99%").and_then(|v| parse_duration_us(&v));
    match (p50, p99) {
        (Some(p50_us), Some(p99_us)) => Ok(Measured {
            rps,
            p50_us,
            p99_us,
            non_2xx,
        }),
        // No request finished (every one timed out): nothing served.
        _ if rps == 0.0 => Ok(Measured {
            rps,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            non_2xx,
        }),
        _ => bail!("no latency distribution in wrk output:\n{text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_about_the_requested_size_and_are_valid_requests() {
        for size in [2048, 32 * 1024, 171 * 1024] {
            let body = chat_body(size);
            assert!(body.len().abs_diff(size) <= 8, "{}", body.len());
            ownerserve_shim::openai::parse(
                body.as_bytes(),
                ownerserve_shim::openai::Endpoint::ChatCompletions,
            )
            .unwrap();
        }
    }

    #[test]
    fn reads_wrk_output() {
        let out = "  Latency Distribution\n     50%  210.00us\n     75%    1.00ms\n     90%    1.20ms\n     99%    1.50ms\n  100 requests in 1.00s, 10.00KB read\n  Non-2xx or 3xx responses: 3\nRequests/sec:    100.50\n";
        let m = parse_wrk(out).unwrap();
        assert_eq!(
            (m.rps, m.p50_us, m.p99_us, m.non_2xx),
            (100.5, 210.0, 1500.0, 3)
        );
        assert_eq!(parse_duration_us("2.00s"), Some(2e6));
        assert_eq!(parse_duration_us("x"), None);
    }
}
