//! `bench replicas`' check that ownership held while several routers served one fleet: what
//! the clients saw (the worker and the ownership epoch each step of a session ran under, in
//! the order sent) against what the directory holds at the end (each session's owner and
//! epoch). A session may change workers only under a new epoch: a step on another worker
//! than the step before it, with no epoch or the same one, is a session served by two
//! workers at once, the failure routers sharing a directory exist to prevent.

use std::collections::BTreeMap;

/// One step as the client saw it: the worker that served it (`x-ownerserve-worker`) and
/// the epoch it ran under (`x-ownerserve-epoch`; none: it ran unfenced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub worker: String,
    pub epoch: Option<u64>,
}

/// A session's owner in the directory at the end of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// The owner's worker name (`None`: the session has no live owner now).
    pub worker: Option<String>,
    pub epoch: u64,
}

/// What the check found over every session of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Sessions with at least one step served.
    pub sessions: usize,
    /// Sessions that changed workers, every change under a higher epoch (a move the
    /// directory fenced).
    pub moved: usize,
    /// Sessions served by two workers without a new epoch between them, or whose epoch
    /// went back: must be 0.
    pub split: usize,
    /// Steps served without an epoch (their claim failed or timed out).
    pub unfenced_steps: usize,
    /// Sessions whose directory owner, at the epoch of their last step, is another worker,
    /// or whose directory epoch is behind what a step ran under: must be 0.
    pub directory_disagrees: usize,
    /// Sessions the directory does not know.
    pub unrecorded: usize,
}

impl Verdict {
    /// Ownership held: no session on two workers, the directory agreeing with the clients.
    pub fn held(&self) -> bool {
        self.split == 0 && self.directory_disagrees == 0
    }
}

/// Checks every session's steps (in the order sent) against the directory's `owners`.
pub fn check(served: &BTreeMap<String, Vec<Served>>, owners: &BTreeMap<String, Owned>) -> Verdict {
    let mut v = Verdict::default();
    for (session, steps) in served {
        let Some(last) = steps.last() else { continue };
        v.sessions += 1;
        v.unfenced_steps += steps.iter().filter(|s| s.epoch.is_none()).count();
        if is_split(steps) {
            v.split += 1;
        } else if steps.iter().any(|s| s.worker != steps[0].worker) {
            v.moved += 1;
        }
        match owners.get(session) {
            None => v.unrecorded += 1,
            Some(owned) => {
                let behind = steps
                    .iter()
                    .filter_map(|s| s.epoch)
                    .any(|e| e > owned.epoch);
                let other_owner = last.epoch == Some(owned.epoch)
                    && owned.worker.as_ref().is_some_and(|w| *w != last.worker);
                if behind || other_owner {
                    v.directory_disagrees += 1;
                }
            }
        }
    }
    v
}

/// The sessions served by two workers without a new epoch, with their steps (to show).
pub fn splits(
    served: &BTreeMap<String, Vec<Served>>,
) -> impl Iterator<Item = (&String, &Vec<Served>)> {
    served.iter().filter(|(_, steps)| is_split(steps))
}

/// Whether consecutive steps changed workers without a higher epoch, or an epoch went back.
fn is_split(steps: &[Served]) -> bool {
    let mut highest: Option<u64> = None;
    for s in steps {
        if let (Some(h), Some(e)) = (highest, s.epoch) {
            if e < h {
                return true;
            }
        }
        highest = highest.max(s.epoch);
    }
    steps.windows(2).any(|w| {
        w[0].worker != w[1].worker
            && !matches!((w[0].epoch, w[1].epoch), (Some(a), Some(b)) if b > a)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(worker: &str, epoch: Option<u64>) -> Served {
        Served {
            worker: worker.to_owned(),
            epoch,
        }
    }

    fn owned(worker: &str, epoch: u64) -> Owned {
        Owned {
            worker: Some(worker.to_owned()),
            epoch,
        }
    }

    fn run(steps: Vec<Served>, owner: Option<Owned>) -> Verdict {
        let served = BTreeMap::from([("s".to_owned(), steps)]);
        let owners = owner.into_iter().map(|o| ("s".to_owned(), o)).collect();
        check(&served, &owners)
    }

    #[test]
    fn a_session_on_its_owner_throughout_holds() {
        let v = run(
            vec![
                step("w0", Some(1)),
                step("w0", Some(1)),
                step("w0", Some(1)),
            ],
            Some(owned("w0", 1)),
        );
        assert_eq!(
            v,
            Verdict {
                sessions: 1,
                ..Verdict::default()
            }
        );
        assert!(v.held());
    }

    #[test]
    fn a_move_under_a_new_epoch_is_counted_but_holds() {
        let v = run(
            vec![
                step("w0", Some(1)),
                step("w1", Some(2)),
                step("w1", Some(2)),
            ],
            Some(owned("w1", 2)),
        );
        assert_eq!((v.moved, v.split, v.directory_disagrees), (1, 0, 0));
        assert!(v.held());
    }

    #[test]
    fn two_workers_under_one_epoch_is_a_split() {
        let v = run(
            vec![step("w0", Some(1)), step("w1", Some(1))],
            Some(owned("w1", 1)),
        );
        assert_eq!((v.moved, v.split), (0, 1));
        assert!(!v.held());
        let served = BTreeMap::from([
            (
                "split".to_owned(),
                vec![step("w0", Some(1)), step("w1", Some(1))],
            ),
            (
                "held".to_owned(),
                vec![step("w0", Some(1)), step("w1", Some(2))],
            ),
        ]);
        let found: Vec<&String> = splits(&served).map(|(id, _)| id).collect();
        assert_eq!(found, vec!["split"]);
    }

    #[test]
    fn an_unfenced_step_on_another_worker_is_a_split() {
        let v = run(
            vec![step("w0", Some(1)), step("w1", None)],
            Some(owned("w0", 1)),
        );
        assert_eq!((v.split, v.unfenced_steps), (1, 1));
    }

    #[test]
    fn an_unfenced_step_on_the_owner_is_only_counted() {
        let v = run(
            vec![step("w0", None), step("w0", Some(1))],
            Some(owned("w0", 1)),
        );
        assert_eq!((v.split, v.unfenced_steps), (0, 1));
        assert!(v.held());
    }

    #[test]
    fn an_epoch_going_back_is_a_split() {
        let v = run(
            vec![step("w0", Some(2)), step("w0", Some(1))],
            Some(owned("w0", 2)),
        );
        assert_eq!(v.split, 1);
    }

    #[test]
    fn the_directory_naming_another_owner_at_the_last_epoch_disagrees() {
        let v = run(vec![step("w0", Some(3))], Some(owned("w2", 3)));
        assert_eq!(v.directory_disagrees, 1);
        assert!(!v.held());
    }

    #[test]
    fn the_directory_behind_a_served_epoch_disagrees() {
        let v = run(vec![step("w0", Some(3))], Some(owned("w0", 2)));
        assert_eq!(v.directory_disagrees, 1);
    }

    #[test]
    fn a_later_move_or_a_lapsed_owner_in_the_directory_agrees() {
        assert!(run(vec![step("w0", Some(1))], Some(owned("w1", 2))).held());
        let lapsed = Owned {
            worker: None,
            epoch: 1,
        };
        assert!(run(vec![step("w0", Some(1))], Some(lapsed)).held());
    }

    #[test]
    fn a_session_the_directory_lacks_is_unrecorded() {
        let v = run(vec![step("w0", None)], None);
        assert_eq!((v.unrecorded, v.directory_disagrees), (1, 0));
    }
}
