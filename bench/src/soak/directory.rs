//! The soak's view of the directory: its linearizable state (`/directory/v1/state`, with
//! the cluster secret) checked against the state machine's invariants and against what
//! clients were told, and a ledger of writes of its own.
//!
//! The ledger: a few keys, each rewritten in turn by one writer with an idempotency key
//! `(client, seq)` retried until acknowledged (a delayed copy of an older write is then
//! refused as a stale retry, so a value can only move forward); each write sets the key's
//! `tail_tokens` to its sequence number. A state read that started after a write was
//! acknowledged and shows a lower number has lost an acknowledged write.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use ownerserve_ownership::ids::{ClientId, SessionId, WorkerId};
use ownerserve_ownership::{Command, Directory, Outcome};

use super::traffic::Records;

/// Keys the ledger rewrites in turn.
const LEDGER_KEYS: u64 = 4;
/// The ledger's client id (routers draw theirs at random from the whole range).
const LEDGER_CLIENT: u64 = 0x50a4_0000_0000_0001;
/// The worker id of the ledger's lease: none of the fleet's.
const LEDGER_WORKER: u32 = 9_999;

/// A client of the directory nodes (cluster secret; 2 s per request).
pub fn client(secret: &str) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        ownerserve_ownership::node::secret::HEADER,
        reqwest::header::HeaderValue::from_str(secret)?,
    );
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .default_headers(headers)
        .build()?)
}

/// The directory's state, read linearizably from the first node that answers.
pub async fn state(http: &reqwest::Client, urls: &[String]) -> Option<Directory> {
    for url in urls {
        let Ok(r) = http.get(format!("{url}/directory/v1/state")).send().await else {
            continue;
        };
        if r.status() != 200 {
            continue;
        }
        let Ok(v) = r.json::<Value>().await else {
            continue;
        };
        if let Ok(d) = serde_json::from_value(v["directory"].clone()) {
            return Some(d);
        }
    }
    None
}

/// A node's Raft view: (leader known, its applied index).
pub async fn node_status(http: &reqwest::Client, url: &str) -> Option<(Option<u64>, u64)> {
    let r = http
        .get(format!("{url}/directory/v1/cluster"))
        .send()
        .await
        .ok()?;
    let v: Value = r.json().await.ok()?;
    Some((
        v["leader"].as_u64(),
        v["last_applied"].as_u64().unwrap_or(0),
    ))
}

/// The highest index any node has applied, and the leader's node id (1-based) if one is
/// known.
pub async fn cluster_now(http: &reqwest::Client, urls: &[String]) -> (u64, Option<u64>) {
    let (mut applied, mut leader) = (0, None);
    for url in urls {
        if let Some((l, a)) = node_status(http, url).await {
            applied = applied.max(a);
            leader = leader.or(l);
        }
    }
    (applied, leader)
}

/// The directory's leader (0-based node index, `Part::Node`'s), if a node names one.
pub async fn leader_now(http: &reqwest::Client, urls: &[String]) -> Option<usize> {
    let (_, leader) = cluster_now(http, urls).await;
    usize::try_from(leader?).ok()?.checked_sub(1)
}

/// Whether worker `id` holds a lease that has not expired.
pub fn leased(d: &Directory, id: u32) -> bool {
    d.leases
        .values()
        .any(|l| l.worker == WorkerId(id) && l.expires_at_ms > d.now_ms)
}

/// Commits `command` as `(client, seq)` through any node, retrying the same pair until
/// acknowledged or `stop`; the outcome.
async fn commit(
    http: &reqwest::Client,
    urls: &[String],
    seq: u64,
    command: &Command,
    stop: &CancellationToken,
) -> Option<Outcome> {
    let body = json!({"client": [ClientId(LEDGER_CLIENT), seq], "command": command});
    for attempt in 0usize.. {
        if stop.is_cancelled() {
            return None;
        }
        let url = &urls[attempt % urls.len()];
        let sent = http
            .post(format!("{url}/directory/v1/commands"))
            .json(&body)
            .send()
            .await;
        if let Ok(r) = sent {
            if r.status().is_success() {
                if let Ok(v) = r.json::<Value>().await {
                    if let Ok(o) = serde_json::from_value::<Outcome>(v["outcome"].clone()) {
                        return Some(o);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// What the ledger has had acknowledged: per key, the highest sequence number and when.
#[derive(Debug, Default)]
pub struct Ledger {
    /// key → (seq, seconds since the soak began when it was acknowledged)
    pub acked: BTreeMap<u64, (u64, f64)>,
    pub writes: u64,
}

/// The ledger's session name for `key`.
fn ledger_session(key: u64) -> SessionId {
    SessionId(format!("soak-ledger-{key}"))
}

/// Grants the ledger's lease (held for `ttl`), then rewrites the keys in turn, one write
/// in flight, every `every`, until `stop`.
pub async fn run_ledger(
    http: reqwest::Client,
    urls: Vec<String>,
    ttl: Duration,
    every: Duration,
    ledger: Arc<Mutex<Ledger>>,
    since: std::time::Instant,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let grant = Command::GrantLease {
        worker: WorkerId(LEDGER_WORKER),
        ttl_ms: u64::try_from(ttl.as_millis())?,
    };
    let Some(Outcome::LeaseGranted { lease, .. }) = commit(&http, &urls, 1, &grant, &stop).await
    else {
        anyhow::ensure!(stop.is_cancelled(), "the ledger's lease was not granted");
        return Ok(());
    };
    for seq in 2u64.. {
        let key = seq % LEDGER_KEYS;
        let command = Command::SetDecodeOwner {
            session: ledger_session(key),
            lease,
            prefix: None,
            tail_tokens: u32::try_from(seq).context("ledger sequence")?,
            predicted_tool_gap_ms: None,
            expect_epoch: None,
        };
        match commit(&http, &urls, seq, &command, &stop).await {
            Some(Outcome::Owned { .. }) => {
                let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
                l.acked.insert(key, (seq, since.elapsed().as_secs_f64()));
                l.writes += 1;
            }
            Some(other) => anyhow::bail!("ledger write {seq} refused: {other:?}"),
            None => return Ok(()),
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(every) => {}
        }
    }
    Ok(())
}

/// What one state read found wrong, against what was acknowledged before it began.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Audit {
    /// The state machine's invariants broken (descriptions).
    pub violations: Vec<String>,
    /// Ledger keys behind an acknowledged write.
    pub ledger_lost: Vec<String>,
    /// Sessions missing, or at an epoch below one a router's answer ran under.
    pub sessions_lost: Vec<String>,
    /// Sessions missing whose worker was killed since their answer: ended with its lease
    /// (the directory's rule for a worker that does not come back in time), not lost.
    pub sessions_ended: usize,
    /// Sessions missing that their client closed: ended at its word (`EndSession`), not
    /// lost.
    pub sessions_closed: usize,
    /// Sessions missing whose last answer is a session retention behind the read: ended
    /// by the routers' retention sweep (idle and demoted that long), not lost.
    pub sessions_retired: usize,
    pub sessions: usize,
    pub artifacts: usize,
    pub responses: usize,
}

/// How much earlier than its last answer a session's last directory write may be: the
/// claim is written before the answer's headers come back (its record after the step
/// comes later still), a second or so at the soak's load.
pub const RETIRE_SLACK_S: f64 = 5.0;

/// Checks `d` (read after `read_at_s`) against the invariants, the ledger and the epochs
/// clients were given (`records.epochs`; `records.kills` says which workers died since,
/// `records.closed` which sessions their clients closed). The routers end a session
/// idle for `retention_s` (0: never); one answered more recently than that (less
/// [`RETIRE_SLACK_S`]) and missing is lost.
pub fn audit(
    d: &Directory,
    read_at_s: f64,
    ledger: &Ledger,
    records: &Records,
    retention_s: f64,
) -> Audit {
    let violations = ownerserve_ownership::invariants::check(d)
        .into_iter()
        .map(|v| v.0)
        .collect();
    let mut ledger_lost = Vec::new();
    for (&key, &(seq, at)) in &ledger.acked {
        if at >= read_at_s {
            continue;
        }
        let got = d.sessions.get(&ledger_session(key)).map(|s| s.tail_tokens);
        if got.is_none_or(|t| u64::from(t) < seq) {
            ledger_lost.push(format!(
                "ledger key {key}: acknowledged {seq}, read {got:?}"
            ));
        }
    }
    let retired = |at_s: f64| retention_s > 0.0 && read_at_s >= at_s + retention_s - RETIRE_SLACK_S;
    let (mut sessions_lost, mut sessions_ended, mut sessions_closed, mut sessions_retired) =
        (Vec::new(), 0, 0, 0);
    for (id, a) in &records.epochs {
        if a.at_s >= read_at_s {
            continue;
        }
        let killed_since = a.worker.as_ref().is_some_and(|w| {
            records
                .kills
                .get(w)
                .is_some_and(|ks| ks.iter().any(|&k| k >= a.at_s))
        });
        match d.sessions.get(&SessionId(id.clone())) {
            None if killed_since => sessions_ended += 1,
            None if records.closed.contains(id) => sessions_closed += 1,
            None if retired(a.at_s) => sessions_retired += 1,
            None => sessions_lost.push(format!("{id}: answered at epoch {}, missing", a.epoch)),
            Some(s) if s.epoch.0 < a.epoch => sessions_lost.push(format!(
                "{id}: answered at epoch {}, directory at {}",
                a.epoch, s.epoch.0
            )),
            Some(_) => {}
        }
    }
    Audit {
        violations,
        ledger_lost,
        sessions_lost,
        sessions_ended,
        sessions_closed,
        sessions_retired,
        sessions: d.sessions.len(),
        artifacts: d.artifacts.len(),
        responses: d.responses.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::traffic::Answered;
    use ownerserve_ownership::Envelope;

    fn apply(d: &mut Directory, index: u64, command: Command) -> Outcome {
        d.apply(
            index,
            &Envelope {
                now_ms: 1,
                client: None,
                command,
            },
        )
    }

    #[test]
    fn a_ledger_key_behind_its_acknowledged_write_is_lost_and_a_later_ack_is_not_judged() {
        let mut d = Directory::new(500);
        let Outcome::LeaseGranted { lease, .. } = apply(
            &mut d,
            1,
            Command::GrantLease {
                worker: WorkerId(LEDGER_WORKER),
                ttl_ms: 60_000,
            },
        ) else {
            panic!("no lease")
        };
        let set = |seq| Command::SetDecodeOwner {
            session: ledger_session(1),
            lease,
            prefix: None,
            tail_tokens: seq,
            predicted_tool_gap_ms: None,
            expect_epoch: None,
        };
        apply(&mut d, 2, set(5));
        let mut ledger = Ledger::default();
        ledger.acked.insert(1, (5, 1.0));
        let none = Records::default();
        assert_eq!(audit(&d, 2.0, &ledger, &none, 0.0), {
            Audit {
                sessions: 1,
                ..Audit::default()
            }
        });
        ledger.acked.insert(1, (9, 1.0));
        assert_eq!(audit(&d, 2.0, &ledger, &none, 0.0).ledger_lost.len(), 1);
        // Acknowledged after the read began: the read may precede it.
        ledger.acked.insert(1, (9, 3.0));
        assert!(audit(&d, 2.0, &ledger, &none, 0.0).ledger_lost.is_empty());
    }

    #[test]
    fn a_session_missing_is_lost_unless_its_worker_died_its_client_closed_it_or_it_idled_out() {
        let d = Directory::new(500);
        let answered = |worker: &str| Answered {
            epoch: 7,
            at_s: 1.0,
            worker: Some(worker.to_owned()),
        };
        let mut records = Records::default();
        records.epochs.insert("s".into(), answered("decode-0"));
        records.epochs.insert("t".into(), answered("decode-1"));
        records.kills.insert("decode-0".into(), vec![1.5]);
        records.kills.insert("decode-1".into(), vec![0.5]);
        let a = audit(&d, 2.0, &Ledger::default(), &records, 0.0);
        assert_eq!(a.sessions_lost, ["t: answered at epoch 7, missing"]);
        assert_eq!(a.sessions_ended, 1);
        // Idle a whole retention (less the slack) at the read: retired; just short: lost.
        let a = audit(
            &d,
            1.0 + 120.0 - RETIRE_SLACK_S,
            &Ledger::default(),
            &records,
            120.0,
        );
        assert!(a.sessions_lost.is_empty());
        assert_eq!(a.sessions_retired, 1);
        let a = audit(
            &d,
            1.0 + 119.0 - RETIRE_SLACK_S,
            &Ledger::default(),
            &records,
            120.0,
        );
        assert_eq!(a.sessions_lost.len(), 1);
        // Its client closed it: ended, not lost.
        records.closed.insert("t".into());
        let a = audit(&d, 2.0, &Ledger::default(), &records, 0.0);
        assert!(a.sessions_lost.is_empty());
        assert_eq!((a.sessions_ended, a.sessions_closed), (1, 1));
    }
}
