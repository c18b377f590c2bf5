//! The soak's faults, one every few minutes in a fixed rotation: kill -9 a directory
//! node, kill -9 the second router, kill -9 a worker, SIGSTOP a router or a node. A killed
//! process stays down for the outage, then starts again on its port and data; a stopped
//! one is continued after it. Each fault is recovered before the next: the process back
//! and healthy, as the checks below define it, timed from its restart (or SIGCONT).
//!
//! One process of each kind is never killed (node 1, router a, the last worker), so its
//! memory and descriptors are watched over the whole run; the SIGSTOPs fall on node 1 and
//! router a, which keeps their memory and still moves the directory's leadership (a node
//! stopped past the election timeout is deposed). The directory kill takes the leader when
//! it is node 2 or 3.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::directory;
use super::topology::{get_json, wait_until, Part, Topology, NODES};

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    KillNode,
    KillRouter,
    KillWorker,
    Stop,
}

impl Kind {
    pub fn verb(self) -> &'static str {
        match self {
            Kind::Stop => "SIGSTOP",
            _ => "kill -9",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Seconds since the soak began.
    pub at_s: f64,
    pub kind: Kind,
    pub victim: String,
    /// Seconds from the restart (or SIGCONT) until healthy; `None`: not within the limit.
    pub recovered_s: Option<f64>,
    /// Seconds since the soak began when it was healthy again (or given up on).
    pub healthy_at_s: f64,
}

/// Fault `i` of the rotation and its victim, given the directory's leader (0-based node
/// index) and the number of workers.
pub fn plan(i: usize, leader: Option<usize>, workers: usize) -> (Kind, Part) {
    let round = i / 4;
    match i % 4 {
        0 => {
            let node = match leader {
                Some(l) if l > 0 && l < NODES => l,
                _ => 1 + round % (NODES - 1),
            };
            (Kind::KillNode, Part::Node(node))
        }
        1 => (Kind::KillRouter, Part::Router(1)),
        2 => (
            Kind::KillWorker,
            Part::Worker(round % workers.saturating_sub(1).max(1)),
        ),
        _ => match round % 2 {
            0 => (Kind::Stop, Part::Node(0)),
            _ => (Kind::Stop, Part::Router(0)),
        },
    }
}

/// The clients the recovery checks use.
pub struct Checks {
    /// Bearer-token client for the routers' operator API.
    pub admin: reqwest::Client,
    /// Cluster-secret client for the directory.
    pub cluster: reqwest::Client,
    pub model: String,
}

impl Checks {
    /// A router answers `/health`, its replica follows the cluster, it sees every worker
    /// healthy, and it serves a request.
    pub async fn router_ready(&self, url: &str, workers: usize) -> bool {
        let health = self.admin.get(format!("{url}/health")).send().await;
        if !health.is_ok_and(|r| r.status().is_success()) {
            return false;
        }
        let cluster = get_json(&self.admin, &format!("{url}/admin/v1/cluster")).await;
        if cluster["replica"]["synced"] != Value::Bool(true)
            || cluster["replica"]["connected"] != Value::Bool(true)
        {
            return false;
        }
        let listed = get_json(&self.admin, &format!("{url}/admin/v1/workers")).await;
        let rows = listed["workers"].as_array().or(listed.as_array());
        let healthy = rows.map_or(0, |w| {
            w.iter()
                .filter(|w| w["healthy"] == Value::Bool(true))
                .count()
        });
        healthy == workers && super::traffic::probe(&self.admin, url, &self.model).await
    }

    /// Every router is ready and every worker holds a live lease.
    pub async fn all_ready(&self, t: &Topology) -> bool {
        for url in t.router_urls() {
            if !self.router_ready(&url, t.workers()).await {
                return false;
            }
        }
        let Some(d) = directory::state(&self.cluster, &t.node_urls()).await else {
            return false;
        };
        (0..t.workers()).all(|i| directory::leased(&d, i as u32))
    }

    /// Whether `part` is healthy again; `target`: the index the cluster had applied when
    /// it came back, which a node must reach.
    async fn recovered(&self, t: &Topology, part: Part, target: u64) -> bool {
        match part {
            Part::Node(i) => {
                let url = &t.node_urls()[i];
                directory::node_status(&self.cluster, url)
                    .await
                    .is_some_and(|(leader, applied)| leader.is_some() && applied >= target)
            }
            Part::Router(i) => self.router_ready(&t.router_urls()[i], t.workers()).await,
            Part::Worker(i) => {
                let up = self
                    .admin
                    .get(format!("{}/health", t.worker_url(i)))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                up && self.all_ready(t).await
            }
        }
    }
}

/// Injects `kind` on `part`: down (or stopped) for `outage`, then back; waits up to
/// `within` for it to recover (and then, if it has not, as long again before giving up).
/// `killed` is called with the victim's name at the kill.
pub async fn inject(
    t: &mut Topology,
    checks: &Checks,
    kind: Kind,
    part: Part,
    outage: Duration,
    within: Duration,
    killed: impl FnOnce(&str),
) -> anyhow::Result<Option<f64>> {
    let name = t.name(part);
    match kind {
        Kind::Stop => {
            t.signal(part, "-STOP")?;
            tokio::time::sleep(outage).await;
            t.signal(part, "-CONT")?;
        }
        _ => {
            killed(&name);
            t.kill(part);
            tokio::time::sleep(outage).await;
            t.restart(part).await?;
        }
    }
    let back = Instant::now();
    let (target, _) = directory::cluster_now(&checks.cluster, &t.node_urls()).await;
    let t_ref: &Topology = t;
    let healthy = wait_until(within, || checks.recovered(t_ref, part, target)).await;
    let took = back.elapsed().as_secs_f64();
    if healthy {
        return Ok(Some(took));
    }
    // Late is a failed criterion; never back is a broken topology the soak cannot go on
    // with.
    if !wait_until(within, || checks.recovered(t_ref, part, target)).await {
        anyhow::bail!(
            "{name} did not recover within {:?} after {}",
            within * 2,
            kind.verb()
        );
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotation_spares_one_of_each_kind_and_takes_a_leader_it_may() {
        let planned: Vec<(Kind, Part)> = (0..8).map(|i| plan(i, Some(0), 4)).collect();
        assert_eq!(
            planned,
            [
                (Kind::KillNode, Part::Node(1)),
                (Kind::KillRouter, Part::Router(1)),
                (Kind::KillWorker, Part::Worker(0)),
                (Kind::Stop, Part::Node(0)),
                (Kind::KillNode, Part::Node(2)),
                (Kind::KillRouter, Part::Router(1)),
                (Kind::KillWorker, Part::Worker(1)),
                (Kind::Stop, Part::Router(0)),
            ]
        );
        assert_eq!(plan(0, Some(2), 4), (Kind::KillNode, Part::Node(2)));
        assert_eq!(plan(10, None, 4), (Kind::KillWorker, Part::Worker(2)));
    }
}
