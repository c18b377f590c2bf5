//! The retention sweep: what the directory keeps that nothing uses any more is removed,
//! so its state (held by every node and every router's replica) stays bounded. Each chat
//! step claims a new, longer prefix artifact, and a session idle past its lease is
//! demoted (`demotion`) but keeps its record and its prefix reference; neither went away
//! before.
//!
//! Every [`SWEEP_EVERY`] (or half the shorter retention, if that is less) the sweep reads
//! this router's copy of the directory and commits, in one `Batch` of at most
//! [`MAX_PER_SWEEP`] commands:
//! - `EndSession` for each demoted session (no owner, not waiting for a lapsed worker)
//!   whose last write is `directory.session_retention_s` behind the directory's clock,
//!   fenced by its epoch (a session resumed meanwhile has a newer one): ending it drops its
//!   prefix reference;
//! - `ForgetArtifact` for each prefix artifact no session is built on, last accessed
//!   `directory.artifact_retention_s` before the directory's clock, fenced by its epoch
//!   and checked again by the directory (refused if a session took it meanwhile). Only
//!   once the directory runs version 3 (`Version::RETENTION`; a rolling upgrade raises it
//!   when every node knows it).
//!
//! Time is the directory's own (`Directory::now_ms`, the leaders' stamps), as the
//! directory checks it. Several routers sweep the same directory: a command another
//! router's sweep applied first is refused (unknown key, or a stale epoch), which is
//! harmless and only counted at debug level.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use ownerserve_ownership::version::Version;
use ownerserve_ownership::{Command, Directory, Outcome};

use crate::config::Retention;
use crate::server::state::AppState;

/// How often the sweep runs at most.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Most commands one sweep commits (one `Batch`, within `MAX_BATCH`).
pub const MAX_PER_SWEEP: usize = 256;

/// How often the sweep runs for `retention`: every [`SWEEP_EVERY`], or every half of
/// the shorter retention if that is less (at least every 100 ms); `None` when both are
/// off.
pub fn period(retention: Retention) -> Option<Duration> {
    let shortest = [retention.artifact, retention.session]
        .into_iter()
        .filter(|d| !d.is_zero())
        .min()?;
    Some(
        (shortest / 2)
            .min(SWEEP_EVERY)
            .max(Duration::from_millis(100)),
    )
}

/// The commands a sweep commits against directory `d` at its own clock: the demoted
/// sessions idle past `retention.session` ended, then the unreferenced artifacts idle
/// past `retention.artifact` forgotten, at most `max` in all (each in key order). A zero
/// retention selects nothing of its kind.
pub fn due(d: &Directory, retention: Retention, max: usize) -> Vec<Command> {
    let now = d.now_ms;
    let idle_for = |last: u64, keep: Duration| -> bool {
        !keep.is_zero() && now.saturating_sub(last) >= duration_ms(keep)
    };
    let sessions = d
        .sessions
        .iter()
        .filter(|(id, s)| {
            s.owner.is_none()
                && !d.lapsed.contains_key(*id)
                && idle_for(s.last_access_ms, retention.session)
        })
        .map(|(id, s)| Command::EndSession {
            session: id.clone(),
            epoch: s.epoch,
        });
    let forgets = d.version >= Version::RETENTION;
    let artifacts = d
        .artifacts
        .iter()
        .filter(move |(_, a)| {
            forgets && a.ref_count == 0 && idle_for(a.last_access_ms, retention.artifact)
        })
        .map(|(key, a)| Command::ForgetArtifact {
            key: *key,
            epoch: a.epoch,
            idle_ms: duration_ms(retention.artifact),
        });
    sessions.chain(artifacts).take(max).collect()
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What one sweep's batch did: artifacts forgotten, sessions ended, and commands refused
/// (most often another router's sweep took them first).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub artifacts: u64,
    pub sessions: u64,
    pub refused: u64,
}

impl Swept {
    /// Tallies a batch's `outcomes`.
    pub fn of(outcomes: &[Outcome]) -> Self {
        let mut swept = Self::default();
        for o in outcomes {
            match o {
                Outcome::Forgotten => swept.artifacts += 1,
                Outcome::SessionEnded => swept.sessions += 1,
                _ => swept.refused += 1,
            }
        }
        swept
    }
}

/// Sweeps until `cancel` fires, wherever the sweep waits (a hung directory must not hold
/// up shutdown). Returns at once when both retentions are off or there is no directory.
pub async fn run(st: Arc<AppState>, cancel: CancellationToken) {
    let retention = st.cfg.retention;
    let Some(every) = period(retention) else {
        return;
    };
    let sweep = async {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            sweep_once(&st, retention).await;
        }
    };
    tokio::select! {
        () = cancel.cancelled() => {}
        () = sweep => {}
    }
}

/// One sweep: reads this router's copy, commits what is due, counts what it removed.
async fn sweep_once(st: &AppState, retention: Retention) {
    let Some(sync) = &st.ownership else { return };
    let client = sync.client();
    let mut commands = Vec::new();
    client.read_local(&mut |d| commands = due(d, retention, MAX_PER_SWEEP));
    if commands.is_empty() {
        return;
    }
    let sent = commands.len();
    let outcomes = match client.write(Command::Batch { commands }).await {
        Ok(Outcome::Batch { outcomes }) => outcomes,
        other => {
            tracing::debug!(?other, sent, "retention sweep not applied");
            return;
        }
    };
    let swept = Swept::of(&outcomes);
    st.metrics.forgotten("artifact", swept.artifacts);
    st.metrics.forgotten("session", swept.sessions);
    tracing::debug!(
        artifacts = swept.artifacts,
        sessions = swept.sessions,
        refused = swept.refused,
        "retention sweep"
    );
}

#[cfg(test)]
mod tests;
