//! Process glue every server command shares: the lines it prints for people and scripts,
//! binding its listener with a clear error, and turning SIGINT/SIGTERM into a
//! cancellation.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a server could not start listening.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot handle {signal}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Cancels `token` on Ctrl-C (SIGINT) or SIGTERM. The handlers are registered before this
/// returns, so a signal sent right after the caller prints its address is not lost. The
/// waiting task belongs to `tracker` and ends with `token`.
pub fn cancel_on_signal(
    token: CancellationToken,
    tracker: &TaskTracker,
) -> Result<(), ProcessError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).map_err(|source| ProcessError::Signal {
        signal: "SIGINT",
        source,
    })?;
    let mut term = signal(SignalKind::terminate()).map_err(|source| ProcessError::Signal {
        signal: "SIGTERM",
        source,
    })?;
    tracker.spawn(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("shutting down"),
            _ = term.recv() => tracing::info!("shutting down"),
            () = token.cancelled() => return,
        }
        token.cancel();
    });
    Ok(())
}

/// Binds, naming the address in the error (a busy port is the usual cause).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ProcessError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ProcessError::Bind { addr, source })
}

/// Prints one line to stdout; tests and scripts read these. A closed pipe (`| head`) is
/// not an error worth a panic: the line is dropped.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
