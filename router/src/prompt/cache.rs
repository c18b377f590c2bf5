//! Each session's last prompt (text, tokens and block hashes), so that its next step,
//! which almost always extends it, tokenizes and hashes only what it adds. Bounded by bytes, least
//! recently used out first. Each entry also holds a digest of the request input it was
//! computed from, so a request whose input is the same (a retry, a stateless prompt sent
//! again) takes the kept prompt as it is, without rendering or tokenizing anything. A step
//! that keeps its own prompt takes the entry out when the cache is its only holder
//! ([`PromptCache::take`]), so the step extends it in place instead of copying it.
//! A session its client closed is over: its entries go at once ([`PromptCache::forget`])
//! rather than wait for the budget to push them out.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ownerserve_planner::hash::HashedPrompt;
#[cfg(test)]
use ownerserve_planner::tokenized::Tokenized;

/// A 128-bit digest of what a prompt was computed from (model input and hash seed); `0`
/// when unknown (never equal to a real one, see [`InputDigest::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InputDigest(pub u128);

impl InputDigest {
    /// The digest of `parts`, in order, each length-prefixed (never `0`).
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Self(h.digest128().max(1))
    }

    /// Whether both are known and equal.
    pub fn matches(self, other: Self) -> bool {
        self.0 != 0 && self == other
    }
}

/// Session → last prompt, within a byte budget.
#[derive(Debug)]
pub struct PromptCache {
    budget_bytes: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<String, (u64, Arc<HashedPrompt>, InputDigest)>,
    /// Last use → session, oldest first.
    order: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

impl Lru {
    /// The session's entry, shared and made the most recently used.
    fn lookup(&mut self, session: &str) -> Option<(Arc<HashedPrompt>, InputDigest)> {
        self.tick += 1;
        let tick = self.tick;
        let (used, prompt, input) = self.entries.get_mut(session)?;
        if let Some(name) = self.order.remove(used) {
            self.order.insert(tick, name);
        }
        *used = tick;
        Some((Arc::clone(prompt), *input))
    }
}

impl PromptCache {
    /// A cache holding at most `budget_bytes` of prompts (0 keeps nothing).
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            inner: Mutex::new(Lru::default()),
        }
    }

    /// The session's last prompt, if kept.
    #[cfg(test)]
    pub fn get(&self, session: &str) -> Option<Arc<HashedPrompt>> {
        self.lookup(session).map(|(p, _)| p)
    }

    /// The session's last prompt and the digest of its input, if kept.
    pub fn lookup(&self, session: &str) -> Option<(Arc<HashedPrompt>, InputDigest)> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lookup(session)
    }

    /// [`Self::lookup`] for a step that keeps its own prompt next: the entry is taken out
    /// when the cache is its only holder, so the step can extend it in place
    /// ([`ownerserve_planner::hash::KeptPrompt`]) and keep the result instead. One still
    /// held elsewhere (the previous step in flight) stays and is shared. A step of the same
    /// session arriving while one computes from a taken entry finds none and tokenizes
    /// its prompt whole; an agent's steps come one after the other.
    pub fn take(&self, session: &str) -> Option<(Arc<HashedPrompt>, InputDigest)> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Only this cache can hand out new references, and it is locked: a count of 1
        // cannot grow meanwhile.
        let sole = guard
            .entries
            .get(session)
            .is_some_and(|(_, p, _)| Arc::strong_count(p) == 1);
        if !sole {
            return guard.lookup(session);
        }
        let lru = &mut *guard;
        let (used, prompt, input) = lru.entries.remove(session)?;
        lru.order.remove(&used);
        lru.bytes -= prompt.heap_bytes() + session.len();
        Some((prompt, input))
    }

    /// Keeps `prompt` as the session's last, evicting the least recently used sessions
    /// beyond the budget (a prompt larger than the whole budget is not kept).
    #[cfg(test)]
    pub fn put(&self, session: &str, prompt: Arc<HashedPrompt>) {
        self.keep(session, prompt, InputDigest::default());
    }

    /// Keeps `prompt` as the session's last, with the digest of its input, evicting the
    /// least recently used sessions beyond the budget.
    pub fn keep(&self, session: &str, prompt: Arc<HashedPrompt>, input: InputDigest) {
        let size = prompt.heap_bytes() + session.len();
        if size > self.budget_bytes {
            return;
        }
        let mut lru = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let lru = &mut *lru;
        lru.tick += 1;
        let tick = lru.tick;
        if let Some((used, old, _)) = lru.entries.remove(session) {
            lru.order.remove(&used);
            lru.bytes -= old.heap_bytes() + session.len();
        }
        while lru.bytes + size > self.budget_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((_, old, _)) = lru.entries.remove(&oldest) {
                lru.bytes -= old.heap_bytes() + oldest.len();
            }
        }
        lru.bytes += size;
        lru.order.insert(tick, session.to_owned());
        lru.entries
            .insert(session.to_owned(), (tick, prompt, input));
    }

    /// Drops every entry kept under `name` for any model (keys `<model>\u{1f}<name>`), and
    /// under its context windows (`<model>\u{1f}<name>:<n>`, Codex's windows of thread
    /// `name`): a closed session's prompts. Entries kept under a prompt's first bytes
    /// (`#…`, shared by every session starting the same way) stay. One pass over the
    /// keys: a close is rare beside steps. Returns the bytes freed.
    pub fn forget(&self, name: &str) -> usize {
        let of_name = |key: &str| {
            key.split_once('\u{1f}').is_some_and(|(_, kept_as)| {
                kept_as
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
            })
        };
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let lru = &mut *guard;
        let keys: Vec<String> = lru.entries.keys().filter(|k| of_name(k)).cloned().collect();
        let mut freed = 0;
        for key in keys {
            if let Some((used, prompt, _)) = lru.entries.remove(&key) {
                lru.order.remove(&used);
                let size = prompt.heap_bytes() + key.len();
                lru.bytes -= size;
                freed += size;
            }
        }
        freed
    }

    /// Bytes held now (prompts' heap and keys, as the budget counts them).
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(tokens: usize) -> Arc<HashedPrompt> {
        Arc::new(HashedPrompt {
            tokenized: Tokenized::from_tokens(vec![7; tokens]),
            hashes: vec![1; tokens / 16],
        })
    }

    #[test]
    fn keeps_the_last_prompt_per_session_and_evicts_the_least_recently_used() {
        let each = prompt(1600).heap_bytes() + 1;
        let cache = PromptCache::new(3 * each);
        for s in ["a", "b", "c"] {
            cache.put(s, prompt(1600));
        }
        assert_eq!(cache.bytes(), 3 * each);
        // "a" is used again, so "b" is now the oldest and leaves first.
        assert!(cache.get("a").is_some());
        cache.put("d", prompt(1600));
        assert!(cache.get("b").is_none());
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        // Replacing a session's prompt frees the old one.
        cache.put("a", prompt(32));
        assert_eq!(cache.get("a").map(|p| p.tokenized.tokens.len()), Some(32));
        assert_eq!(cache.bytes(), 2 * each + prompt(32).heap_bytes() + 1);
        // Too large for the whole budget: not kept, nothing evicted for it.
        cache.put("huge", prompt(16_000));
        assert!(cache.get("huge").is_none());
        assert!(cache.get("c").is_some());
        // A zero budget keeps nothing.
        let off = PromptCache::new(0);
        off.put("a", prompt(16));
        assert!(off.get("a").is_none());
    }

    #[test]
    fn a_closed_session_s_prompts_are_forgotten_under_every_model_and_window() {
        let cache = PromptCache::new(1 << 24);
        let kept = [
            "m\u{1f}s",
            "other\u{1f}s",
            "m\u{1f}s:2",
            "m\u{1f}#0123456789abcdef",
            "m\u{1f}s2",
            "m\u{1f}t",
        ];
        for key in kept {
            cache.put(key, prompt(160));
        }
        let each = prompt(160).heap_bytes();
        let freed = cache.forget("s");
        assert_eq!(
            freed,
            3 * each + "m\u{1f}s".len() + "other\u{1f}s".len() + "m\u{1f}s:2".len()
        );
        for key in ["m\u{1f}s", "other\u{1f}s", "m\u{1f}s:2"] {
            assert!(cache.get(key).is_none(), "{key} forgotten");
        }
        // Another session's, and the shared start of every session, stay.
        for key in ["m\u{1f}#0123456789abcdef", "m\u{1f}s2", "m\u{1f}t"] {
            assert!(cache.get(key).is_some(), "{key} kept");
        }
        let left: usize = ["m\u{1f}#0123456789abcdef", "m\u{1f}s2", "m\u{1f}t"]
            .iter()
            .map(|k| each + k.len())
            .sum();
        assert_eq!(cache.bytes(), left);
        assert_eq!(cache.forget("s"), 0, "nothing left of it");
    }

    #[test]
    fn a_prompt_is_taken_out_only_when_the_cache_is_its_sole_holder() {
        let cache = PromptCache::new(1 << 20);
        cache.put("a", prompt(1600));
        let (taken, _) = cache.take("a").expect("kept");
        assert_eq!(Arc::strong_count(&taken), 1, "the step owns it");
        assert!(cache.get("a").is_none());
        assert_eq!(cache.bytes(), 0);
        // Held by a step still in flight: shared, and left in the cache.
        cache.put("a", taken);
        let in_flight = cache.get("a").expect("kept");
        let (shared, _) = cache.take("a").expect("kept");
        assert!(Arc::ptr_eq(&shared, &in_flight));
        assert!(cache.get("a").is_some());
        assert!(cache.take("b").is_none());
    }
}
