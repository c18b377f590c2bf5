//! Logs: `tracing` events to stderr, as text or as JSON lines (one object per event),
//! filtered by `OWNERSERVE_LOG` (`info,openraft=error` by default: the embedded
//! directory's Raft library logs every election and membership step at INFO, and warns on
//! each answer its caller stopped waiting for, which the directory client already reports;
//! e.g. `OWNERSERVE_LOG=debug,openraft=warn`).
//!
//! A line written while a request is served carries that request as its `request` span
//! (`request_id`, `method`, `route`), read from [`ownerserve_edge::request_scope`] rather
//! than from a `tracing` span, which cost ~6 µs of every request. The two formats here
//! write what `tracing-subscriber`'s own full and JSON formats write, with that span.

use std::fmt;

use ownerserve_edge::request_scope::{self, RequestScope};
use serde::Deserialize;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
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
        LogFormat::Text => builder.event_format(TextLine).try_init(),
        LogFormat::Json => builder.event_format(JsonLine).try_init(),
    };
}

/// `2026-11-24T07:17:57.123456Z  WARN request{request_id=.. method=POST route=..}:
/// ownerserve_router::proxy: forward failed worker=a`: the time, the level, the request
/// and any span in scope, the target, the fields.
pub struct TextLine;

impl<S, N> FormatEvent<S, N> for TextLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        SystemTime.format_time(&mut w)?;
        if w.has_ansi_escapes() {
            write!(
                w,
                " {}{:>5}\x1b[0m ",
                level_color(*meta.level()),
                meta.level()
            )?;
        } else {
            write!(w, " {:>5} ", meta.level())?;
        }
        request_scope::try_with(|s| {
            write!(
                w,
                "request{{request_id={} method={} route={}}}: ",
                s.request_id(),
                s.method,
                s.route.as_str()
            )
        })
        .transpose()?;
        // Spans of the libraries, as the default format shows them.
        for span in ctx.event_scope().into_iter().flat_map(|s| s.from_root()) {
            w.write_str(span.name())?;
            let ext = span.extensions();
            if let Some(fields) = ext.get::<FormattedFields<N>>().filter(|f| !f.is_empty()) {
                write!(w, "{{{fields}}}")?;
            }
            w.write_str(": ")?;
        }
        write!(w, "{}: ", meta.target())?;
        ctx.format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// The ANSI color of a level, as the default format paints it.
fn level_color(level: Level) -> &'static str {
    match level {
        Level::TRACE => "\x1b[35m",
        Level::DEBUG => "\x1b[34m",
        Level::INFO => "\x1b[32m",
        Level::WARN => "\x1b[33m",
        Level::ERROR => "\x1b[31m",
    }
}

/// One JSON object per event: `timestamp`, `level`, `target`, `fields` (with `message`)
/// and, while a request is served, `span` (`name: "request"`, `request_id`, `method`,
/// `route`).
pub struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = JsonFields(Map::new());
        event.record(&mut fields);
        let mut line = Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert("fields".into(), Value::Object(fields.0));
        if let Some(span) = request_scope::try_with(span_json) {
            line.insert("span".into(), span);
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(w, "{text}")
    }
}

/// The request as the JSON line's `span`.
fn span_json(s: &RequestScope) -> Value {
    serde_json::json!({
        "name": "request",
        "request_id": s.request_id(),
        "method": s.method.as_str(),
        "route": s.route.as_str(),
    })
}

/// An event's fields as JSON values.
struct JsonFields(Map<String, Value>);

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use axum::http::{HeaderValue, Method};
    use ownerserve_edge::tracked::Route;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

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

    /// The lines `format` writes for one warning outside any request and one inside.
    async fn lines(format: LogFormat) -> Vec<String> {
        let out = Captured::default();
        let writer = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let dispatch: tracing::Dispatch = match format {
            LogFormat::Text => builder.event_format(TextLine).into(),
            LogFormat::Json => builder.event_format(JsonLine).into(),
        };
        let _guard = tracing::dispatcher::set_default(&dispatch);
        tracing::warn!(worker = "a", n = 3, "outside");
        let scope = RequestScope {
            request_id: HeaderValue::from_static("req-7"),
            method: Method::POST,
            route: Route::Named("/v1/chat/completions"),
        };
        request_scope::scoped(scope, async {
            tokio::task::yield_now().await;
            tracing::warn!(ok = true, "inside");
        })
        .await;
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_text_line_names_the_request_it_was_written_for() {
        let lines = lines(LogFormat::Text).await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0]
                .contains(" WARN ownerserve_router::ops::logging::tests: outside worker=\"a\" n=3"),
            "{}",
            lines[0]
        );
        assert!(!lines[0].contains("request{"), "{}", lines[0]);
        assert!(
            lines[1].contains(
                " WARN request{request_id=req-7 method=POST route=/v1/chat/completions}: ownerserve_router::ops::logging::tests: inside ok=true"
            ),
            "{}",
            lines[1]
        );
    }

    #[tokio::test]
    async fn a_json_line_carries_the_request_as_its_span() {
        let lines = lines(LogFormat::Json).await;
        let parsed: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(parsed[0]["level"], "WARN");
        assert_eq!(parsed[0]["fields"]["message"], "outside");
        assert_eq!(parsed[0]["fields"]["worker"], "a");
        assert_eq!(parsed[0]["fields"]["n"], 3);
        assert!(parsed[0].get("span").is_none());
        assert!(parsed[0]["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(parsed[1]["fields"]["message"], "inside");
        assert_eq!(parsed[1]["fields"]["ok"], true);
        assert_eq!(parsed[1]["span"]["name"], "request");
        assert_eq!(parsed[1]["span"]["request_id"], "req-7");
        assert_eq!(parsed[1]["span"]["method"], "POST");
        assert_eq!(parsed[1]["span"]["route"], "/v1/chat/completions");
    }
}
