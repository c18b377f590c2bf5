//! Each session's last prompt (text, tokens and block hashes), so that its next step,
//! which almost always extends it, tokenizes and hashes only what it adds. Bounded by bytes, least
//! recently used out first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ownerserve_planner::hash::HashedPrompt;
#[cfg(test)]
use ownerserve_planner::tokenized::Tokenized;

/// Session → last prompt, within a byte budget.
#[derive(Debug)]
pub struct PromptCache {
    budget_bytes: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<String, (u64, Arc<HashedPrompt>)>,
    /// Last use → session, oldest first.
    order: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
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
    pub fn get(&self, session: &str) -> Option<Arc<HashedPrompt>> {
        let mut lru = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let lru = &mut *lru;
        lru.tick += 1;
        let tick = lru.tick;
        let (used, prompt) = lru.entries.get_mut(session)?;
        if let Some(name) = lru.order.remove(used) {
            lru.order.insert(tick, name);
        }
        *used = tick;
        Some(Arc::clone(prompt))
    }

    /// Keeps `prompt` as the session's last, evicting the least recently used sessions
    /// beyond the budget (a prompt larger than the whole budget is not kept).
    pub fn put(&self, session: &str, prompt: Arc<HashedPrompt>) {
        let size = prompt.heap_bytes() + session.len();
        if size > self.budget_bytes {
            return;
        }
        let mut lru = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let lru = &mut *lru;
        lru.tick += 1;
        let tick = lru.tick;
        if let Some((used, old)) = lru.entries.remove(session) {
            lru.order.remove(&used);
            lru.bytes -= old.heap_bytes() + session.len();
        }
        while lru.bytes + size > self.budget_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((_, old)) = lru.entries.remove(&oldest) {
                lru.bytes -= old.heap_bytes() + oldest.len();
            }
        }
        lru.bytes += size;
        lru.order.insert(tick, session.to_owned());
        lru.entries.insert(session.to_owned(), (tick, prompt));
    }

    /// Bytes held now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
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
}
