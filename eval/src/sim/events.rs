//! The simulator's event queue: events in virtual time, ties broken by insertion order so
//! a run is deterministic.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Something that happens at a point in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A client sends step `step` of session `session`.
    Issue { session: usize, step: usize },
    /// Worker `worker`'s current engine step ends.
    StepEnd { worker: usize },
    /// The KV a request waited for has arrived on its decode worker.
    Arrived { req: usize },
    /// Session `session` may have been idle past its lease since `generation`.
    IdleCheck { session: usize, generation: u64 },
    /// A lifecycle sweep of session `session`, parked since `generation`.
    Lifecycle { session: usize, generation: u64 },
}

#[derive(Debug)]
struct Timed {
    at_s: f64,
    order: u64,
    event: Event,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Timed {}

impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timed {
    // Reversed: the heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_s
            .total_cmp(&self.at_s)
            .then(other.order.cmp(&self.order))
    }
}

/// Pending events, earliest first.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    heap: BinaryHeap<Timed>,
    next: u64,
}

impl Queue {
    pub fn push(&mut self, at_s: f64, event: Event) {
        self.heap.push(Timed {
            at_s,
            order: self.next,
            event,
        });
        self.next += 1;
    }

    pub fn pop(&mut self) -> Option<(f64, Event)> {
        self.heap.pop().map(|t| (t.at_s, t.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_insertion_order() {
        let mut q = Queue::default();
        q.push(2.0, Event::StepEnd { worker: 2 });
        q.push(1.0, Event::StepEnd { worker: 1 });
        q.push(1.0, Event::StepEnd { worker: 3 });
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(
            order,
            [
                Event::StepEnd { worker: 1 },
                Event::StepEnd { worker: 3 },
                Event::StepEnd { worker: 2 }
            ]
        );
    }
}
