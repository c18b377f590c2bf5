//! Where one session's KV is between its steps, as its owner's router tracks it, and what
//! the router must ask the engine to do as that changes. Pure: the router and the
//! simulator feed it the lifecycle decision, the engine's events and the session's
//! return or end, and carry out the [`Effect`]s it returns.
//!
//! Invariants (property-tested below over random event orders): the KV is in exactly one
//! place, so offloaded KV is never counted resident; a pin is asked for only while
//! resident and not already pinned, and every pin is undone by the time the session is
//! released; a released session asks for nothing more.

use serde::Serialize;

use super::{Hold, Lifecycle, Retention};

/// Where a session's KV is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum KvPlace {
    /// In the owner's HBM (its prefix cache).
    Hbm,
    /// In the owner's host tier only.
    Host,
    /// Nowhere: evicted, or never computed.
    Gone,
}

/// What the router asks the owner's engine to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Effect {
    /// Hold the session's KV ahead of unreferenced cache.
    Pin,
    /// Stop holding it.
    Unpin,
    /// Copy it to the host tier and free its HBM.
    Offload,
    /// Copy it back from the host tier.
    Restore,
    /// Compute it again (a prefetch: a one-token request on the prefix).
    Recompute,
    /// Touch it so the LRU keeps it.
    Touch,
}

impl KvPlace {
    pub fn name(self) -> &'static str {
        match self {
            KvPlace::Hbm => "hbm",
            KvPlace::Host => "host",
            KvPlace::Gone => "gone",
        }
    }
}

impl Effect {
    pub fn name(self) -> &'static str {
        match self {
            Effect::Pin => "pin",
            Effect::Unpin => "unpin",
            Effect::Offload => "offload",
            Effect::Restore => "restore",
            Effect::Recompute => "recompute",
            Effect::Touch => "touch",
        }
    }
}

/// One session's KV on its owner.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParkedKv {
    place: KvPlace,
    pinned: bool,
    /// Parked (waiting on a tool) rather than running a step.
    parked: bool,
    released: bool,
    /// The decision made when it parked.
    hold: Option<Hold>,
    /// A restore or recompute was asked for and has not landed.
    bringing_back: bool,
    /// One landed: kept warm from then on.
    back: bool,
}

/// What a returning step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Returned {
    /// Where its KV was when it came back.
    pub found: KvPlace,
    /// A restore or prefetch was under way (it waits for it).
    pub late: bool,
}

impl Default for ParkedKv {
    fn default() -> Self {
        Self::new()
    }
}

impl ParkedKv {
    /// A session running its first step: its KV is being computed on the owner.
    pub fn new() -> Self {
        Self {
            place: KvPlace::Hbm,
            pinned: false,
            parked: false,
            released: false,
            hold: None,
            bringing_back: false,
            back: false,
        }
    }

    pub fn place(&self) -> KvPlace {
        self.place
    }

    /// Counted in the owner's HBM.
    pub fn resident(&self) -> bool {
        self.place == KvPlace::Hbm
    }

    pub fn offloaded(&self) -> bool {
        self.place == KvPlace::Host
    }

    pub fn pinned(&self) -> bool {
        self.pinned
    }

    pub fn released(&self) -> bool {
        self.released
    }

    pub fn hold(&self) -> Option<Hold> {
        self.hold
    }

    /// Its step ended and it waits on a tool: carry out `decision` on an engine with
    /// `retention`. Parked already, the decision is revised (the load changed): a pin no
    /// longer wanted is undone, one now wanted taken.
    pub fn park(&mut self, decision: &Lifecycle, retention: Retention) -> Vec<Effect> {
        if self.released {
            return Vec::new();
        }
        let before = self.hold.replace(decision.hold);
        self.parked = true;
        let mut out = Vec::new();
        let pins = decision.hold == Hold::Keep && retention == Retention::Hold;
        if self.pinned && !pins {
            self.pinned = false;
            out.push(Effect::Unpin);
        }
        match decision.hold {
            Hold::Keep if pins && !self.pinned && self.resident() => {
                self.pinned = true;
                out.push(Effect::Pin);
            }
            Hold::Offload if self.resident() && before != Some(Hold::Offload) => {
                out.push(Effect::Offload)
            }
            _ => {}
        }
        out
    }

    /// The engine reports the KV copied to the host tier (its HBM blocks freed).
    pub fn offload_landed(&mut self) {
        if !self.released && self.place == KvPlace::Hbm && !self.pinned {
            self.place = KvPlace::Host;
        }
    }

    /// The engine evicted the session's blocks from HBM (a pinned session is not evicted).
    pub fn evicted(&mut self) {
        if !self.pinned && self.place == KvPlace::Hbm {
            self.place = KvPlace::Gone;
        }
    }

    /// The host tier dropped the copy.
    pub fn host_dropped(&mut self) {
        if self.place == KvPlace::Host {
            self.place = KvPlace::Gone;
        }
    }

    /// A touch is due: asked for only while kept warm (kept from the start, or brought
    /// back).
    /// A kept session found evicted anyway (its touches came too late) is not touched: its
    /// next decision, knowing it is gone, prices bringing it back against letting it go.
    pub fn touch(&self) -> Option<Effect> {
        let kept = self.hold == Some(Hold::Keep) || self.back;
        (self.parked && !self.released && kept && self.resident()).then_some(Effect::Touch)
    }

    /// Time to bring it back before the predicted return.
    pub fn bring_back(&mut self) -> Option<Effect> {
        if !self.parked || self.released || self.bringing_back {
            return None;
        }
        let effect = match self.place {
            KvPlace::Hbm => return None,
            KvPlace::Host => Effect::Restore,
            KvPlace::Gone => Effect::Recompute,
        };
        self.bringing_back = true;
        Some(effect)
    }

    /// The restore or recompute landed: the KV is in HBM again.
    pub fn brought_back(&mut self) {
        if self.bringing_back && !self.released {
            self.place = KvPlace::Hbm;
            self.back = true;
        }
        self.bringing_back = false;
    }

    /// The session's next step arrived: what it found, and the pin it no longer needs
    /// (the running step holds its blocks). Its KV is in HBM once the step runs.
    pub fn returned(&mut self) -> (Returned, Vec<Effect>) {
        let found = Returned {
            found: self.place,
            late: self.bringing_back,
        };
        let mut out = Vec::new();
        if self.released {
            return (found, out);
        }
        if self.pinned {
            self.pinned = false;
            out.push(Effect::Unpin);
        }
        self.parked = false;
        self.hold = None;
        self.bringing_back = false;
        self.back = false;
        self.place = KvPlace::Hbm;
        (found, out)
    }

    /// The session ended (closed by its client, its lease lapsed, its owner left):
    /// release its pin; nothing more is asked for it.
    pub fn end(&mut self) -> Vec<Effect> {
        if self.released {
            return Vec::new();
        }
        self.released = true;
        self.parked = false;
        self.bringing_back = false;
        self.hold = None;
        let mut out = Vec::new();
        if std::mem::take(&mut self.pinned) {
            out.push(Effect::Unpin);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn decision(hold: Hold) -> Lifecycle {
        Lifecycle {
            hold,
            bring_back_in_s: None,
            touch_every_s: None,
            costs: [0.0; 4],
        }
    }

    #[derive(Debug, Clone)]
    enum Event {
        Park(Hold, bool),
        OffloadLanded,
        Evicted,
        HostDropped,
        Touch,
        BringBack,
        BroughtBack,
        Returned,
        End,
    }

    fn event() -> impl Strategy<Value = Event> {
        let hold = prop_oneof![
            Just(Hold::Keep),
            Just(Hold::Offload),
            Just(Hold::Prefetch),
            Just(Hold::LetGo)
        ];
        prop_oneof![
            (hold, any::<bool>()).prop_map(|(h, pins)| Event::Park(h, pins)),
            Just(Event::OffloadLanded),
            Just(Event::Evicted),
            Just(Event::HostDropped),
            Just(Event::Touch),
            Just(Event::BringBack),
            Just(Event::BroughtBack),
            Just(Event::Returned),
            Just(Event::End),
        ]
    }

    proptest! {
        #[test]
        fn offloaded_kv_is_never_resident_and_a_released_session_holds_no_pin(
            events in proptest::collection::vec(event(), 0..64)
        ) {
            let mut kv = ParkedKv::new();
            let mut pins = 0i32;
            for e in events {
                let was_released = kv.released();
                let effects = match e {
                    Event::Park(h, pins) => {
                        let r = if pins { Retention::Hold } else { Retention::Touch };
                        let resident = kv.resident();
                        let out = kv.park(&decision(h), r);
                        if out.contains(&Effect::Pin) {
                            prop_assert!(resident, "a pin on KV not in HBM");
                        }
                        out
                    }
                    Event::OffloadLanded => { kv.offload_landed(); vec![] }
                    Event::Evicted => { kv.evicted(); vec![] }
                    Event::HostDropped => { kv.host_dropped(); vec![] }
                    Event::Touch => kv.touch().into_iter().collect(),
                    Event::BringBack => kv.bring_back().into_iter().collect(),
                    Event::BroughtBack => { kv.brought_back(); vec![] }
                    Event::Returned => kv.returned().1,
                    Event::End => kv.end(),
                };
                if was_released {
                    prop_assert!(effects.is_empty(), "a released session asked for {effects:?}");
                }
                for f in &effects {
                    match f {
                        Effect::Pin => pins += 1,
                        Effect::Unpin => pins -= 1,
                        _ => {}
                    }
                }
                prop_assert!(!(kv.resident() && kv.offloaded()));
                prop_assert!((0..=1).contains(&pins), "pins {pins}");
                prop_assert_eq!(pins == 1, kv.pinned());
                if kv.pinned() {
                    prop_assert!(kv.resident(), "pinned KV left HBM");
                }
                if kv.released() {
                    prop_assert!(!kv.pinned());
                    prop_assert_eq!(pins, 0);
                }
            }
            kv.end();
            prop_assert!(!kv.pinned());
        }
    }

    #[test]
    fn a_kept_session_on_a_holding_engine_is_pinned_until_it_returns() {
        let mut kv = ParkedKv::new();
        assert_eq!(
            kv.park(&decision(Hold::Keep), Retention::Hold),
            [Effect::Pin]
        );
        kv.evicted();
        assert!(kv.resident(), "a pin holds against the LRU");
        let (found, effects) = kv.returned();
        assert_eq!((found.found, effects), (KvPlace::Hbm, vec![Effect::Unpin]));
    }

    #[test]
    fn an_offloaded_session_is_restored_and_one_let_go_is_recomputed() {
        let mut kv = ParkedKv::new();
        assert_eq!(
            kv.park(&decision(Hold::Offload), Retention::Touch),
            [Effect::Offload]
        );
        kv.offload_landed();
        assert!(kv.offloaded() && !kv.resident());
        assert_eq!(kv.bring_back(), Some(Effect::Restore));
        assert_eq!(kv.bring_back(), None, "one restore at a time");
        let (found, _) = kv.returned();
        assert!(found.late, "returned before the restore landed: it waits");
        let mut gone = ParkedKv::new();
        gone.park(&decision(Hold::Prefetch), Retention::Touch);
        assert_eq!(gone.bring_back(), None, "still in HBM: nothing to do");
        gone.evicted();
        assert_eq!(gone.bring_back(), Some(Effect::Recompute));
        gone.brought_back();
        assert_eq!(gone.returned().0.found, KvPlace::Hbm);
    }
}
