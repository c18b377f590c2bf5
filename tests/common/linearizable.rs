//! The linearizability checker of the directory's fault runs (e2e_linearizability and
//! chaos): claims, fenced releases and linearizable reads recorded with their invocation
//! and response times, checked per key with stateright's `LinearizabilityTester` against
//! a sequential model of the directory; and the clients that issue them through faults.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    Claim { lease: u64 },
    Release { epoch: u64 },
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ret {
    Owned(u64),
    Held(u64),
    Released,
    /// Rejected for a stale epoch; the directory names the current one.
    Stale(u64),
    NoOwner,
    /// The key was never claimed.
    Unknown,
    /// Owner lease (if any) and epoch.
    Read(Option<u64>, u64),
    /// No response arrived: the operation may or may not have taken effect.
    NoResponse,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub client: usize,
    pub key: u64,
    pub op: Op,
    /// `None` if no response arrived before the client gave up.
    pub ret: Option<(Ret, Duration)>,
    pub invoke: Duration,
}

/// What a key looks like to the sequential model. After a release the exact epoch (the
/// release's own log position) is unknown, only that it is greater than `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State {
    pub owner: Option<u64>,
    pub epoch: u64,
    pub exact: bool,
}

impl State {
    /// Whether the current epoch can be `c`.
    fn epoch_may_be(&self, c: u64) -> bool {
        if self.exact {
            c == self.epoch
        } else {
            c > self.epoch
        }
    }

    fn learn(self, c: u64) -> State {
        State {
            epoch: c,
            exact: true,
            ..self
        }
    }
}

/// A key before its first claim (it does not exist yet).
pub const NEVER_CLAIMED: State = State {
    owner: None,
    epoch: 0,
    exact: true,
};

/// The sequential specification: the state after `op` returned `ret`, if that can happen.
/// Leases live for the whole run, so a live owner's claim stands.
pub fn step(s: State, op: Op, ret: Ret) -> Option<State> {
    match (op, ret) {
        (Op::Claim { lease }, Ret::Owned(e)) => match s.owner {
            None if e > s.epoch => Some(State {
                owner: Some(lease),
                epoch: e,
                exact: true,
            }),
            Some(o) if o == lease && s.epoch_may_be(e) => Some(s.learn(e)),
            _ => None,
        },
        (Op::Claim { lease }, Ret::Held(m)) => (s.owner == Some(m) && m != lease).then_some(s),
        (Op::Release { epoch }, Ret::Released) => (s.owner.is_some() && s.epoch_may_be(epoch))
            .then_some(State {
                owner: None,
                epoch,
                exact: false,
            }),
        (Op::Release { epoch }, Ret::Stale(c)) => {
            (c != epoch && s.epoch_may_be(c)).then(|| s.learn(c))
        }
        (Op::Release { epoch }, Ret::NoOwner) => {
            (s.owner.is_none() && s.epoch_may_be(epoch)).then(|| s.learn(epoch))
        }
        (Op::Release { .. }, Ret::Unknown) => (s == NEVER_CLAIMED).then_some(s),
        (Op::Read, Ret::Read(owner, c)) => {
            (owner == s.owner && s.epoch_may_be(c)).then(|| s.learn(c))
        }
        _ => None,
    }
}

/// The sequential model as stateright's tester sees it: a completed operation is a valid
/// step if `step` allows it.
impl SequentialSpec for State {
    type Op = Op;
    type Ret = Ret;

    /// Used only for an operation left without a response. It may have taken effect, with
    /// an epoch nobody learned.
    fn invoke(&mut self, op: &Op) -> Ret {
        match *op {
            Op::Claim { lease } if self.owner.is_none() => {
                *self = State {
                    owner: Some(lease),
                    exact: false,
                    ..*self
                };
            }
            Op::Release { epoch } if self.owner.is_some() && self.epoch_may_be(epoch) => {
                *self = State {
                    owner: None,
                    epoch,
                    exact: false,
                };
            }
            _ => {}
        }
        Ret::NoResponse
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        step(*self, *op, *ret).map(|next| *self = next).is_some()
    }
}

/// Whether one key's history is linearizable. Invocations and responses are fed to the
/// tester in time order; at equal times invocations go first, which only adds concurrency.
pub fn linearizable(history: &[Event]) -> bool {
    let mut timeline: Vec<(Duration, bool, &Event)> = Vec::new();
    for e in history {
        timeline.push((e.invoke, false, e));
        if let Some((_, at)) = e.ret {
            timeline.push((at, true, e));
        }
    }
    timeline.sort_by_key(|(at, is_response, _)| (*at, *is_response));
    let mut tester = LinearizabilityTester::new(NEVER_CLAIMED);
    for (_, is_response, e) in timeline {
        let fed = match e.ret {
            Some((ret, _)) if is_response => tester.on_return(e.client, ret).map(|_| ()),
            _ => tester.on_invoke(e.client, e.op).map(|_| ()),
        };
        if let Err(malformed) = fed {
            panic!("malformed history: {malformed}");
        }
    }
    tester.serialized_history().is_some()
}

/// The directory's state, read linearizably from any node (retried for 20 s).
pub async fn directory_state(
    c: &reqwest::Client,
    urls: &[String],
) -> Option<ownerserve_ownership::state::Directory> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        for url in urls {
            if let Ok(r) = c.get(format!("{url}/directory/v1/state")).send().await {
                if r.status() == 200 {
                    let v: Value = r.json().await.ok()?;
                    return serde_json::from_value(v["directory"].clone()).ok();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A client of the directory nodes (with the cluster secret; 1.5 s per request).
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .default_headers(super::cluster_secret_headers())
        .build()
        .unwrap()
}

/// Commits a command, retrying with the same idempotency key through faults (40 s at most).
pub async fn write(
    c: &reqwest::Client,
    urls: &[String],
    client: u64,
    seq: u64,
    command: Value,
) -> Option<Value> {
    write_within(c, urls, (client, seq), command, Duration::from_secs(40)).await
}

/// Commits a command as `(client, seq)`, retrying through faults for up to `within`.
pub async fn write_within(
    c: &reqwest::Client,
    urls: &[String],
    (client, seq): (u64, u64),
    command: Value,
    within: Duration,
) -> Option<Value> {
    let body = json!({"client": [client, seq], "command": command});
    let deadline = Instant::now() + within;
    let mut i = (client as usize) % urls.len();
    while Instant::now() < deadline {
        if let Ok(resp) = c
            .post(format!("{}/directory/v1/commands", urls[i]))
            .json(&body)
            .send()
            .await
        {
            if resp.status() == 200 {
                return Some(resp.json::<Value>().await.ok()?["outcome"].clone());
            }
        }
        i = (i + 1) % urls.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A linearizable read of `key`: owner lease and epoch (trying for 40 s at most).
pub async fn read(c: &reqwest::Client, urls: &[String], key: u64) -> Option<Ret> {
    read_within(c, urls, key, Duration::from_secs(40)).await
}

/// A linearizable read of `key`, trying for up to `within`.
pub async fn read_within(
    c: &reqwest::Client,
    urls: &[String],
    key: u64,
    within: Duration,
) -> Option<Ret> {
    let deadline = Instant::now() + within;
    let mut i = 0;
    while Instant::now() < deadline {
        if let Ok(resp) = c
            .get(format!("{}/directory/v1/state", urls[i]))
            .send()
            .await
        {
            if resp.status() == 200 {
                let v: Value = resp.json().await.ok()?;
                let a = &v["directory"]["artifacts"][key.to_string()];
                return Some(Ret::Read(
                    a["owner"]["lease"].as_u64(),
                    a["epoch"].as_u64().unwrap_or(0),
                ));
            }
        }
        i = (i + 1) % urls.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The checker's view of a command's outcome.
pub fn ret_of(outcome: &Value) -> Ret {
    if let Some(e) = outcome["Owned"]["epoch"].as_u64() {
        Ret::Owned(e)
    } else if let Some(l) = outcome["Held"]["owner"]["lease"].as_u64() {
        Ret::Held(l)
    } else if outcome == "Released" {
        Ret::Released
    } else if let Some(c) = outcome["Rejected"]["StaleEpoch"]["current"].as_u64() {
        Ret::Stale(c)
    } else if outcome["Rejected"]["NoOwner"].is_u64() {
        Ret::NoOwner
    } else if outcome["Rejected"]["UnknownPrefix"].is_u64() {
        Ret::Unknown
    } else {
        panic!("unexpected outcome {outcome}")
    }
}

/// The index (0-based) of the node the cluster names as leader.
pub async fn leader_index(c: &reqwest::Client, urls: &[String]) -> Option<usize> {
    for url in urls {
        if let Ok(r) = c.get(format!("{url}/directory/v1/cluster")).send().await {
            if let Ok(v) = r.json::<Value>().await {
                if let Some(l) = v["leader"].as_u64() {
                    return Some(l as usize - 1);
                }
            }
        }
    }
    None
}
