//! Long texts between added tokens already tokenized, so a new one that ends as a kept one
//! does (the same system prompt in every session of an agent; a long document sent again
//! after a different first line) tokenizes only what precedes the shared end.
//!
//! Why that is exact. The splits walk a text left to right: each search for the next match
//! starts where the last match ended and reads only the bytes from there on (the patterns
//! this is used for have no look-behind). So at a byte where a first-level match ended, a
//! *restart point*, what follows splits, and hence tokenizes, as the text from that byte
//! on would alone. When a new text `b` and a kept text `a` end with the same bytes, and a
//! restart point of `b` inside that shared end falls where `a` had one too, the ids of `b`
//! from there on are `a`'s from there on. In text, both walks meet at a restart point a
//! few bytes into the shared part (a space or a line break ends a match in both); where
//! they never do, the new text is walked to its end, as without the cache.
//!
//! A kept text records its restart points sparsely (the first at or after every
//! [`MARK_EVERY`] bytes) with the ids before each; the new text's walk checks each of its
//! restart points inside the shared end against them and stops at the first that is one.
//! Texts are found by their last [`KEY_BYTES`] bytes; the shared end is then measured
//! byte by byte, so a found text that ends otherwise only costs that comparison.
//! Bounded by bytes, least recently used out first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Texts shorter than this are tokenized whole (they take a few tens of µs).
pub(super) const MIN_TEXT_BYTES: usize = 4096;
/// The shared end must be at least this long to be worth stopping for.
const MIN_SHARED_BYTES: usize = 1024;
/// A kept text's restart points are recorded at most once per this many bytes.
pub(super) const MARK_EVERY: usize = 256;
/// Texts are found by a hash of this many last bytes.
const KEY_BYTES: usize = 64;
/// Bytes kept in all (texts, ids and marks) by default.
pub(super) const DEFAULT_BUDGET_BYTES: usize = 64 << 20;

/// A tokenized text: its bytes, ids, and some restart points with the ids before them.
#[derive(Debug)]
pub(super) struct Kept {
    text: Box<[u8]>,
    ids: Box<[u32]>,
    /// `(restart byte, ids before it)`, ascending.
    marks: Box<[(u32, u32)]>,
}

impl Kept {
    fn bytes(&self) -> usize {
        self.text.len() + 4 * self.ids.len() + 8 * self.marks.len()
    }
}

/// Kept texts, found by their last bytes.
#[derive(Debug)]
pub(super) struct SegmentCache {
    budget_bytes: usize,
    inner: Mutex<Lru>,
    /// Texts whose walk stopped at a kept restart point (for tests).
    #[cfg(test)]
    pub(super) stops: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct Lru {
    /// Key → (last use, text).
    entries: HashMap<u64, (u64, Arc<Kept>)>,
    /// Last use → key, oldest first.
    order: BTreeMap<u64, u64>,
    tick: u64,
    bytes: usize,
}

/// The key of a text of at least [`KEY_BYTES`]: a hash of its last bytes.
fn key(text: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&text[text.len().saturating_sub(KEY_BYTES)..])
}

/// How many bytes `a` and `b` end with in common.
fn shared_end(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 64;
    let mut n = 0;
    let most = a.len().min(b.len());
    // Whole chunks compared at once, then the last one byte by byte.
    while n + CHUNK <= most
        && a[a.len() - n - CHUNK..a.len() - n] == b[b.len() - n - CHUNK..b.len() - n]
    {
        n += CHUNK;
    }
    while n < most && a[a.len() - n - 1] == b[b.len() - n - 1] {
        n += 1;
    }
    n
}

impl SegmentCache {
    pub(super) fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            inner: Mutex::new(Lru::default()),
            #[cfg(test)]
            stops: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How to tokenize `text`: a kept text it ends as, if any, and where the shared end
    /// starts.
    pub(super) fn resume(&self, text: &str) -> Resume {
        let mut resume = Resume {
            from: text.len(),
            ..Resume::default()
        };
        if text.len() < MIN_TEXT_BYTES {
            return resume;
        }
        let k = key(text.as_bytes());
        let kept = {
            let mut lru = self.lock();
            lru.tick += 1;
            let tick = lru.tick;
            let Some((used, kept)) = lru.entries.get_mut(&k) else {
                return resume;
            };
            let (old, kept) = (std::mem::replace(used, tick), kept.clone());
            lru.order.remove(&old);
            lru.order.insert(tick, k);
            kept
        };
        let shared = shared_end(&kept.text, text.as_bytes());
        if shared >= MIN_SHARED_BYTES {
            resume.from = text.len() - shared;
            resume.shift = kept.text.len() as i64 - text.len() as i64;
            resume.kept = Some(kept);
        }
        resume
    }

    /// Keeps `text` (tokenized as `resume` saw), evicting the least recently used texts
    /// beyond the budget; a text that is the kept one it was found by stays as it is.
    pub(super) fn keep(&self, text: &str, ids: &[u32], resume: Resume) {
        if text.len() < MIN_TEXT_BYTES {
            return;
        }
        #[cfg(test)]
        if resume.stopped.is_some() {
            self.stops
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let same = resume.from == 0 && resume.shift == 0 && resume.kept.is_some();
        if same {
            return;
        }
        let (Ok(_), Ok(_)) = (u32::try_from(text.len()), u32::try_from(ids.len())) else {
            return;
        };
        let kept = Arc::new(Kept {
            text: text.as_bytes().into(),
            ids: ids.into(),
            marks: resume.marks.into(),
        });
        if kept.bytes() > self.budget_bytes {
            return;
        }
        let k = key(text.as_bytes());
        let mut lru = self.lock();
        lru.tick += 1;
        let tick = lru.tick;
        lru.bytes += kept.bytes();
        if let Some((used, old)) = lru.entries.insert(k, (tick, kept)) {
            lru.order.remove(&used);
            lru.bytes -= old.bytes();
        }
        lru.order.insert(tick, k);
        while lru.bytes > self.budget_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((_, gone)) = lru.entries.remove(&oldest) {
                lru.bytes -= gone.bytes();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

/// One text's tokenizing against a kept text: where their shared end starts, the restart
/// points the walk has passed (kept with the text), and where it stopped.
#[derive(Debug, Default)]
pub(super) struct Resume {
    kept: Option<Arc<Kept>>,
    /// The first byte of the shared end (the text's length when there is none).
    from: usize,
    /// A byte of this text is byte `+ shift` of the kept one.
    shift: i64,
    /// The next kept mark not yet passed.
    cursor: usize,
    /// This text's restart points so far, and the byte at which the next is recorded.
    marks: Vec<(u32, u32)>,
    next_mark: usize,
    /// Where in the kept ids this text's rest starts, once the walk has stopped.
    stopped: Option<usize>,
}

impl Resume {
    /// At restart point `at`, with `ids_before` ids of this text before it: whether the
    /// walk stops here, the kept text having a restart point here too (its ids from here
    /// on are then [`Resume::rest`]).
    pub(super) fn stop_at(&mut self, at: usize, ids_before: usize) -> bool {
        if let Some(kept_before) = self.kept_restart(at) {
            // This text's marks from here on are the kept text's, moved by the shift.
            let (shift, mine) = (self.shift, ids_before as i64 - i64::from(kept_before));
            let kept = self
                .kept
                .as_ref()
                .map_or(&[][..], |k| &k.marks[self.cursor..]);
            self.marks.extend(kept.iter().filter_map(|&(b, n)| {
                Some((
                    u32::try_from(i64::from(b) - shift).ok()?,
                    u32::try_from(i64::from(n) + mine).ok()?,
                ))
            }));
            self.stopped = Some(kept_before as usize);
            return true;
        }
        if at >= self.next_mark {
            self.marks.push((at as u32, ids_before as u32));
            self.next_mark = (at / MARK_EVERY + 1) * MARK_EVERY;
        }
        false
    }

    /// The ids before the kept text's restart point at this text's byte `at`, if it has
    /// one there and `at` is inside the shared end.
    fn kept_restart(&mut self, at: usize) -> Option<u32> {
        if at < self.from {
            return None;
        }
        let kept = self.kept.as_ref()?;
        let there = u32::try_from(at as i64 + self.shift).ok()?;
        while kept.marks.get(self.cursor).is_some_and(|&(b, _)| b < there) {
            self.cursor += 1;
        }
        let &(b, before) = kept.marks.get(self.cursor)?;
        (b == there).then_some(before)
    }

    /// The kept ids that follow where the walk stopped (none when it did not stop).
    pub(super) fn rest(&self) -> &[u32] {
        match (&self.kept, self.stopped) {
            (Some(kept), Some(at)) => kept.ids.get(at..).unwrap_or_default(),
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_end_is_counted_byte_by_byte_across_chunks() {
        let a = "x".repeat(300) + &"y".repeat(200);
        let b = "z".repeat(10) + &"x".repeat(77) + &"y".repeat(200);
        assert_eq!(shared_end(a.as_bytes(), b.as_bytes()), 277);
        assert_eq!(shared_end(a.as_bytes(), a.as_bytes()), a.len());
        assert_eq!(shared_end(b"abc", b"abd"), 0);
        assert_eq!(shared_end(b"", b"abc"), 0);
    }

    /// A text found by its end, against a kept one: the walk stops at the first restart
    /// point inside the shared end that the kept text has too, takes the kept ids from
    /// there, and keeps the kept text's later marks, moved.
    #[test]
    fn a_walk_stops_where_the_kept_text_restarted_too() {
        let cache = SegmentCache::new(1 << 20);
        let shared = "w ".repeat(3000);
        let a = format!("first {shared}");
        // `a`'s restart points: every other byte from 6 on; one id per piece.
        let mut resume = cache.resume(&a);
        let mut ids = Vec::new();
        for at in (0..=a.len()).filter(|b| *b == 0 || (*b >= 6 && b % 2 == 0)) {
            assert!(!resume.stop_at(at, ids.len()));
            ids.push(at as u32);
        }
        ids.pop();
        cache.keep(&a, &ids, resume);
        let b = format!("second, longer {shared}");
        let mut resume = cache.resume(&b);
        assert_eq!(resume.from, b.len() - shared.len() - 1, "the shared end");
        let shift = a.len() as i64 - b.len() as i64;
        let mut stopped = None;
        for at in (0..=b.len()).filter(|b| b % 2 == 1) {
            if resume.stop_at(at, 100 + at) {
                stopped = Some(at);
                break;
            }
        }
        let at = stopped.expect("stops inside the shared end");
        assert!(at >= resume.from);
        assert_eq!(
            at as i64 + shift,
            256,
            "the first kept mark past the shared end's start"
        );
        assert_eq!(
            resume.rest().first(),
            Some(&256),
            "the kept ids from that mark on"
        );
        let (last, n) = *resume.marks.last().unwrap();
        assert_eq!(
            last as i64 + shift,
            (a.len() / MARK_EVERY * MARK_EVERY) as i64
        );
        // `a` had one id per restart point (two bytes) between its marks 256 and `last`.
        let a_between = (last as i64 + shift - 256) / 2;
        assert_eq!(
            i64::from(n),
            (100 + at) as i64 + a_between,
            "ids counted on from b's own"
        );
    }

    /// Beyond the budget the least recently used texts go; a text too big for it is not
    /// kept; short texts are never looked for.
    #[test]
    fn the_budget_evicts_the_least_recently_used() {
        let text = |c: char| c.to_string().repeat(MIN_TEXT_BYTES);
        let one = MIN_TEXT_BYTES + 4 + 8;
        let cache = SegmentCache::new(2 * one);
        for c in ['a', 'b'] {
            let mut r = cache.resume(&text(c));
            assert!(!r.stop_at(0, 0));
            cache.keep(&text(c), &[1], r);
        }
        assert!(cache.resume(&text('a')).kept.is_some(), "a used again");
        let mut r = cache.resume(&text('c'));
        assert!(!r.stop_at(0, 0));
        cache.keep(&text('c'), &[1], r);
        assert_eq!(cache.len(), 2);
        assert!(cache.resume(&text('a')).kept.is_some());
        assert!(
            cache.resume(&text('b')).kept.is_none(),
            "b was the least recently used"
        );
        cache.keep(&"d".repeat(3 * one), &[1], Resume::default());
        assert_eq!(cache.len(), 2, "too big to keep");
        assert!(cache.resume("short").kept.is_none());
    }
}
