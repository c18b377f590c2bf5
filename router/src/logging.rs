//! Logs: `tracing` events to stderr, as text or as JSON lines (one object per event, with
//! the request span's fields such as `request_id`), filtered by `OWNERSERVE_LOG`
//! (`info,openraft=error` by default: the embedded directory's Raft library logs every
//! election and membership step at INFO, and warns on each answer its caller stopped
//! waiting for, which the directory client already reports; e.g.
//! `OWNERSERVE_LOG=debug,openraft=warn`).

use serde::Deserialize;
use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// The filter when `OWNERSERVE_LOG` is unset.
const DEFAULT_FILTER: &str = "info,openraft=error";

/// Installs the process's subscriber (once; later calls change nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("OWNERSERVE_LOG")
        .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Fails only when a subscriber is already installed, which is then kept.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}
