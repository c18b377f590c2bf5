//! A faster `encode` for byte-level BPE tokenizers whose pre-tokenizer is regex splits
//! (DeepSeek, Llama 3, Qwen, GPT-2 and their kin), with the same ids as the `tokenizers`
//! crate's own pipeline.
//!
//! That pipeline spends most of a long prompt's time in `fancy-regex` (the pattern's
//! `\s+(?!\S)` lookahead makes it backtrack), in the per-byte offset bookkeeping of every
//! split, and in the BPE model's per-token strings. Here the added tokens are split off by
//! `added_split` (the crate's own `AddedVocabulary` only for tokens that strip spaces or
//! match single words), the text between them is split by DFAs, and each piece's ids come
//! from a cache of their own (`piece_cache`: text repeats its words) or from the BPE model.
//! A long text between added tokens that ends as one encoded before (`segment_cache`) is
//! walked only until a restart point the two share, and takes the kept ids from there.
//!
//! A split pattern without look-around is walked byte by byte on its DFA from each byte a
//! match can start with (`Scanner`): pieces are a few bytes long, and a search through
//! the `meta` engine costs far more per call than walking them. The DFA is built whole at
//! load when it fits in 8 MiB (DeepSeek's and GPT-2's patterns do), else walked lazily.
//! Other patterns, and gaps where failed attempts would walk too much, go through the
//! `meta` engine (a match anchored where the previous one ended first: pieces are
//! contiguous in most text).
//! The DFAs' caches and the piece cache are kept in a pool of scratch states, one per
//! thread encoding at a time (not the `regex` crate's shared pool, whose slow path every
//! thread but the first takes on each search).
//!
//! The lookahead is the one construct `regex` lacks. A pattern `A|\s+(?!\S)|\s+` is run as
//! `A|\s+`: where `A` does not match and `\s+` takes a whitespace run that a non-space
//! follows, `\s+(?!\S)` would have given back the run's last character (unless the run is
//! that one character, which `\s+` then takes), so the match is shortened by it. Patterns
//! with other lookarounds, other pre-tokenizers, normalizers, truncation or padding keep
//! the crate's pipeline. Differential tests compare both on random text.

use std::sync::Mutex;

use regex_automata::dfa::{dense, dense::DFA as DenseDfa, Automaton, StartKind};
use regex_automata::hybrid::dfa::{Cache as LazyCache, DFA as LazyDfa};
use regex_automata::util::primitives::StateID;
use regex_automata::{meta, Anchored, Input, Match};
use serde_json::Value;
use tokenizers::{Model, OffsetReferential, OffsetType, Tokenizer};

use super::added_split::{AddedSplit, Segment};
use super::piece_cache::PieceCache;
use super::segment_cache::{self, SegmentCache};

/// The crate's `ByteLevel` pre-tokenizer's own split pattern (`use_regex: true`).
const BYTE_LEVEL_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The whitespace lookahead this emulates, at the end of a pattern.
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";

/// A pattern's DFA walked byte by byte for anchored matches: a split's pieces are a few
/// bytes long, and a search through the `meta` engine costs far more per call than walking
/// them. Only for patterns without look-around assertions (`^`, `\b`, ...: the start state
/// is then the same everywhere) that cannot match the empty string.
#[derive(Debug)]
struct Scanner {
    walk: Walk,
    /// Bytes a match can start with (the others lead the start state to the dead state).
    starts: [bool; 256],
}

/// The DFA a [`Scanner`] walks.
#[derive(Debug)]
enum Walk {
    /// Built whole, with its anchored start state: a transition is one table read, and the
    /// start state is found once, not per piece.
    Dense {
        dfa: DenseDfa<Vec<u32>>,
        start: StateID,
    },
    /// Built as it is walked, in a cache per thread ([`Scanner::cache`]), for a pattern
    /// whose whole DFA would not fit: each transition checks the cache.
    Lazy(LazyDfa),
}

/// Most memory a split pattern's dense DFA may take (and its determinization), beyond
/// which it is walked lazily. DeepSeek's three patterns take well under it.
const DENSE_DFA_BYTES: usize = 8 << 20;

/// Failed anchored attempts in one gap may walk this many bytes per gap byte (plus
/// [`SCAN_SLACK`]) before the search falls back to the `meta` engine's linear one (a
/// pattern like `a+b` on a run of `a`s would otherwise walk the run once per byte).
const SCAN_WASTE_PER_BYTE: usize = 4;
const SCAN_SLACK: usize = 256;

impl Scanner {
    /// The scanner of `pattern`, on its dense DFA when that fits in `dense_bytes`, else on
    /// its lazy one; `None` for a pattern it cannot walk.
    fn new(pattern: &str, dense_bytes: usize) -> Option<Self> {
        let hir = regex_automata::util::syntax::parse(pattern).ok()?;
        let props = hir.properties();
        if !props.look_set().is_empty() || props.minimum_len().is_none_or(|n| n == 0) {
            return None;
        }
        // Without look-around the start state is the same at every position.
        let anchored = Input::new("").anchored(Anchored::Yes);
        let dense = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(dense_bytes))
                    .determinize_size_limit(Some(dense_bytes)),
            )
            .build(pattern)
            .ok();
        let mut starts = [true; 256];
        let walk = match dense {
            Some(dfa) => {
                let start = dfa.start_state_forward(&anchored).ok()?;
                for (b, can) in starts.iter_mut().enumerate() {
                    *can = !dfa.is_dead_state(dfa.next_state(start, b as u8));
                }
                Walk::Dense { dfa, start }
            }
            None => {
                let dfa = LazyDfa::new(pattern).ok()?;
                let mut cache = dfa.create_cache();
                let start = dfa.start_state_forward(&mut cache, &anchored).ok()?;
                for (b, can) in starts.iter_mut().enumerate() {
                    let next = dfa.next_state(&mut cache, start, b as u8).ok()?;
                    *can = !next.is_dead();
                }
                Walk::Lazy(dfa)
            }
        };
        Some(Self { walk, starts })
    }

    /// The cache a thread walks a lazy DFA in (`None`: a dense one needs none).
    fn cache(&self) -> Option<LazyCache> {
        match &self.walk {
            Walk::Dense { .. } => None,
            Walk::Lazy(dfa) => Some(dfa.create_cache()),
        }
    }

    /// The end of the leftmost-first match that starts at `at` (`Ok`), or the bytes walked
    /// to find there is none (`Err`); `None` when the DFA cannot tell (a lazy one's cache
    /// gave up or is missing, or it quit).
    fn anchored_end(
        &self,
        cache: Option<&mut LazyCache>,
        s: &[u8],
        at: usize,
    ) -> Option<Result<usize, usize>> {
        let found = |end: Option<usize>, walked: usize| end.ok_or(walked);
        let mut end = None;
        let dfa = match &self.walk {
            Walk::Dense { dfa, start } => {
                let mut sid = *start;
                for (i, &b) in s.iter().enumerate().skip(at) {
                    sid = dfa.next_state(sid, b);
                    if dfa.is_special_state(sid) {
                        if dfa.is_match_state(sid) {
                            // Matches show one byte late: this one ended before byte `i`.
                            end = Some(i);
                        } else if dfa.is_dead_state(sid) {
                            return Some(found(end, i + 1 - at));
                        } else if dfa.is_quit_state(sid) {
                            return None;
                        }
                    }
                }
                if dfa.is_match_state(dfa.next_eoi_state(sid)) {
                    end = Some(s.len());
                }
                return Some(found(end, s.len() - at));
            }
            Walk::Lazy(dfa) => dfa,
        };
        let cache = cache?;
        let mut sid = dfa
            .start_state_forward(cache, &Input::new(s).range(at..).anchored(Anchored::Yes))
            .ok()?;
        for (i, &b) in s.iter().enumerate().skip(at) {
            sid = dfa.next_state(cache, sid, b).ok()?;
            if sid.is_tagged() {
                if sid.is_match() {
                    // Matches show one byte late: this one ended before byte `i`.
                    end = Some(i);
                } else if sid.is_dead() {
                    return Some(found(end, i + 1 - at));
                } else if sid.is_quit() {
                    return None;
                }
            }
        }
        sid = dfa.next_eoi_state(cache, sid).ok()?;
        if sid.is_match() {
            end = Some(s.len());
        }
        Some(found(end, s.len() - at))
    }

    /// The leftmost-first match in `s[at..]` (`Some(None)`: there is none), found by
    /// anchored attempts at each byte a match can start with; `None` when the attempts
    /// cannot tell or have walked too much.
    fn find(&self, mut cache: Option<&mut LazyCache>, s: &str, at: usize) -> Option<Option<Match>> {
        let bytes = s.as_bytes();
        let mut wasted = 0;
        for p in at..bytes.len() {
            if !self.starts[usize::from(bytes[p])] || !s.is_char_boundary(p) {
                continue;
            }
            match self.anchored_end(cache.as_deref_mut(), bytes, p)? {
                Ok(end) => return Some(Some(Match::must(0, p..end))),
                Err(walked) => {
                    wasted += walked;
                    if wasted > SCAN_WASTE_PER_BYTE * (p + 1 - at) + SCAN_SLACK {
                        return None;
                    }
                }
            }
        }
        Some(None)
    }
}

/// One `Split` pre-tokenizer (behavior `Isolated`): every match and every gap a piece.
#[derive(Debug)]
struct SplitRegex {
    /// The pattern, its lookahead tail run as `|\s+`.
    regex: meta::Regex,
    /// The same, walked byte by byte where it can be.
    scan: Option<Scanner>,
    /// For a pattern with the lookahead tail: its alternatives before it (`A`), to tell
    /// whether a whitespace match is `A`'s (kept) or the tail's (maybe shortened).
    head: Option<meta::Regex>,
    /// `head`, walked byte by byte where it can be.
    head_scan: Option<Scanner>,
    /// Whether the pattern has no look-around assertion (`^`, `\b`, ...), so a search
    /// from a byte reads nothing before it.
    reads_forward: bool,
}

/// What a split's walk reports, in order.
enum Walked<'s> {
    /// A piece.
    Piece(&'s str),
    /// A byte where the walk's next search starts (the start, or where a match ended):
    /// what follows splits as the text from here on would alone.
    Restart(usize),
}

/// The search caches of one [`SplitRegex`], for one thread at a time.
#[derive(Debug)]
struct SplitCaches {
    regex: meta::Cache,
    scan: Option<LazyCache>,
    head: Option<meta::Cache>,
    head_scan: Option<LazyCache>,
}

impl SplitRegex {
    fn new(pattern: &str) -> Option<Self> {
        Self::with_dense_limit(pattern, DENSE_DFA_BYTES)
    }

    /// [`Self::new`], its scanners' dense DFAs limited to `dense_bytes` (0: all lazy).
    fn with_dense_limit(pattern: &str, dense_bytes: usize) -> Option<Self> {
        let (body, head) = match pattern.strip_suffix(LOOKAHEAD_TAIL) {
            Some(head) => (format!(r"{head}|\s+"), Some(head)),
            None => (pattern.to_owned(), None),
        };
        if ["(?=", "(?!", "(?<=", "(?<!"]
            .iter()
            .any(|look| body.contains(look))
        {
            return None;
        }
        let reads_forward = regex_automata::util::syntax::parse(&body)
            .is_ok_and(|hir| hir.properties().look_set().is_empty());
        Some(Self {
            reads_forward,
            regex: meta::Regex::new(&body).ok()?,
            scan: Scanner::new(&body, dense_bytes),
            head: match head {
                Some(h) => Some(meta::Regex::new(h).ok()?),
                None => None,
            },
            head_scan: head.and_then(|h| Scanner::new(h, dense_bytes)),
        })
    }

    fn caches(&self) -> SplitCaches {
        SplitCaches {
            regex: self.regex.create_cache(),
            scan: self.scan.as_ref().and_then(Scanner::cache),
            head: self.head.as_ref().map(meta::Regex::create_cache),
            head_scan: self.head_scan.as_ref().and_then(Scanner::cache),
        }
    }

    /// The leftmost-first match in `s[at..]`: by the byte walk where it can tell, else by
    /// the `meta` engine.
    fn find_at(&self, c: &mut SplitCaches, s: &str, at: usize) -> Option<Match> {
        if let Some(scan) = &self.scan {
            if let Some(m) = scan.find(c.scan.as_mut(), s, at) {
                return m;
            }
        }
        // A match that starts at `at` is the one an unanchored search would find (it is
        // the leftmost), so that is tried first.
        let input = Input::new(s).range(at..);
        if let Some(m) = self
            .regex
            .search_with(&mut c.regex, &input.clone().anchored(Anchored::Yes))
        {
            if !m.is_empty() {
                return Some(m);
            }
        }
        self.regex.search_with(&mut c.regex, &input)
    }

    /// Calls `f` with each piece of `s`, in order.
    fn pieces<'s>(&self, c: &mut SplitCaches, s: &'s str, f: &mut dyn FnMut(&'s str)) {
        self.pieces_until(c, s, &mut |step| {
            if let Walked::Piece(p) = step {
                f(p);
            }
            false
        });
    }

    /// Calls `f` with each piece of `s`, in order, and with each restart point (the start,
    /// and each byte where a match ended and the next search starts) until `f` returns
    /// `true` for one.
    fn pieces_until<'s>(
        &self,
        c: &mut SplitCaches,
        s: &'s str,
        f: &mut dyn FnMut(Walked<'s>) -> bool,
    ) {
        let (mut prev, mut at) = (0, 0);
        if f(Walked::Restart(0)) {
            return;
        }
        while at < s.len() {
            let Some(m) = self.find_at(c, s, at) else {
                break;
            };
            let (start, mut end) = (m.start(), m.end());
            if start == end {
                // An empty match splits nothing; search on past the next character.
                at = end + s[end..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            if end < s.len() && self.tail_match(c, s, start, end) {
                let last = s[start..end].chars().next_back().map_or(0, char::len_utf8);
                if end - last > start {
                    end -= last;
                }
            }
            if prev < start {
                f(Walked::Piece(&s[prev..start]));
            }
            f(Walked::Piece(&s[start..end]));
            (prev, at) = (end, end);
            if f(Walked::Restart(end)) {
                return;
            }
        }
        if prev < s.len() {
            f(Walked::Piece(&s[prev..]));
        }
    }

    /// Whether `s[start..end]` is the lookahead tail's match (all whitespace, and `A`
    /// matches nothing at `start`).
    fn tail_match(&self, c: &mut SplitCaches, s: &str, start: usize, end: usize) -> bool {
        let (Some(head), Some(cache)) = (&self.head, c.head.as_mut()) else {
            return false;
        };
        if !s[start..end].chars().all(char::is_whitespace) {
            return false;
        }
        if let Some(scan) = &self.head_scan {
            if let Some(end) = scan.anchored_end(c.head_scan.as_mut(), s.as_bytes(), start) {
                return end.is_err();
            }
        }
        head.search_with(cache, &Input::new(s).range(start..).anchored(Anchored::Yes))
            .is_none()
    }
}

/// Ids, and `(byte just past, tokens up to)` per added token.
type Encoded = (Vec<u32>, Vec<(usize, usize)>);

/// Scratch states kept for reuse (one per thread that encodes at a time; more are made
/// and dropped when more threads encode at once).
const MAX_IDLE_SCRATCH: usize = 16;

/// What one encoding works with, handed to the next one.
#[derive(Debug)]
struct Scratch {
    /// One per split pattern.
    splits: Vec<SplitCaches>,
    /// Pieces' bytes → their ids.
    pieces: PieceCache,
    /// A piece in the byte-level alphabet, for the model.
    mapped: String,
}

/// The fast path for one tokenizer, when its pipeline is one this reproduces.
#[derive(Debug)]
pub(super) struct FastEncode {
    splits: Vec<SplitRegex>,
    /// GPT-2's byte → character table of the byte-level alphabet.
    byte_char: [char; 256],
    /// Idle scratch states.
    scratch: Mutex<Vec<Scratch>>,
    /// The split at added tokens, when it needs no more than matching (else the crate's).
    added: Option<AddedSplit>,
    /// Long texts between added tokens already tokenized, when the splits read only
    /// forward from where they search (see `segment_cache`).
    kept: Option<SegmentCache>,
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for
/// the characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        out[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    out
}

/// The split patterns of a pre-tokenizer made of `Split`s (`Isolated`, not inverted) and
/// one final `ByteLevel` without a prefix space; `None` for anything else.
fn split_patterns(pre: &Value) -> Option<Vec<String>> {
    let steps = match pre.get("type")?.as_str()? {
        "Sequence" => pre.get("pretokenizers")?.as_array()?.clone(),
        _ => vec![pre.clone()],
    };
    let (last, splits) = steps.split_last()?;
    let byte_level =
        last.get("type")?.as_str()? == "ByteLevel" && !last.get("add_prefix_space")?.as_bool()?;
    if !byte_level {
        return None;
    }
    let mut patterns = Vec::new();
    for s in splits {
        let isolated = s.get("type")?.as_str()? == "Split"
            && s.get("behavior")?.as_str()? == "Isolated"
            && !s.get("invert")?.as_bool()?;
        if !isolated {
            return None;
        }
        patterns.push(s.get("pattern")?.get("Regex")?.as_str()?.to_owned());
    }
    if last.get("use_regex")?.as_bool()? {
        patterns.push(BYTE_LEVEL_PATTERN.to_owned());
    }
    Some(patterns)
}

impl FastEncode {
    /// The fast path for the tokenizer read from `json` (its `tokenizer.json`), if its
    /// pipeline is one this reproduces: no normalizer (or an empty sequence), a BPE model
    /// without dropout, no truncation or padding, and regex splits then byte-level.
    pub(super) fn for_tokenizer(json: &Value) -> Option<Self> {
        let no_normalizer = match json.get("normalizer") {
            None | Some(Value::Null) => true,
            Some(n) => {
                n.get("type")?.as_str()? == "Sequence"
                    && n.get("normalizers")?.as_array()?.is_empty()
            }
        };
        let model = json.get("model")?;
        let bpe = model.get("type")?.as_str()? == "BPE"
            && model.get("dropout").is_none_or(Value::is_null)
            && !model
                .get("byte_fallback")
                .and_then(Value::as_bool)
                .unwrap_or(false);
        let plain = json.get("truncation").is_none_or(Value::is_null)
            && json.get("padding").is_none_or(Value::is_null);
        if !(no_normalizer && bpe && plain) {
            return None;
        }
        let splits = split_patterns(json.get("pre_tokenizer")?)?
            .iter()
            .map(|p| SplitRegex::new(p))
            .collect::<Option<Vec<_>>>()?;
        let kept = (!splits.is_empty() && splits.iter().all(|s| s.reads_forward))
            .then(|| SegmentCache::new(segment_cache::DEFAULT_BUDGET_BYTES));
        Some(Self {
            kept,
            splits,
            byte_char: byte_chars(),
            scratch: Mutex::new(Vec::new()),
            added: AddedSplit::for_tokenizer(json),
        })
    }

    /// An idle scratch state, or a new one.
    fn take_scratch(&self) -> Scratch {
        let idle = self.scratch.lock().ok().and_then(|mut v| v.pop());
        idle.unwrap_or_else(|| Scratch {
            splits: self.splits.iter().map(SplitRegex::caches).collect(),
            pieces: PieceCache::default(),
            mapped: String::new(),
        })
    }

    /// `text` split at added tokens: by [`AddedSplit`], or by the crate's added vocabulary.
    fn segments(&self, tokenizer: &Tokenizer, text: &str) -> Vec<Segment> {
        let mut out = Vec::new();
        if let Some(added) = &self.added {
            added.split(text, &mut out);
            return out;
        }
        let pre = tokenizer
            .get_added_vocabulary()
            .extract_and_normalize(tokenizer.get_normalizer(), text);
        for (_, (start, end), tokens) in
            pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        {
            match tokens {
                Some(tokens) => out.extend(tokens.iter().map(|t| Segment::Added { id: t.id, end })),
                None => out.push(Segment::Text { start, end }),
            }
        }
        out
    }

    fn put_scratch(&self, scratch: Scratch) {
        if let Ok(mut idle) = self.scratch.lock() {
            if idle.len() < MAX_IDLE_SCRATCH {
                idle.push(scratch);
            }
        }
    }

    /// The ids of `text` (no special tokens added) and, per added token, the byte just
    /// past it and the tokens up to it (`is_added` tells which ids are added tokens).
    pub(super) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        is_added: impl Fn(u32) -> bool,
    ) -> tokenizers::Result<Encoded> {
        let segments = self.segments(tokenizer, text);
        let model = tokenizer.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut checkpoints = Vec::new();
        let mut failed = None;
        let mut scratch = self.take_scratch();
        let Scratch {
            splits,
            pieces,
            mapped,
        } = &mut scratch;
        for segment in segments {
            let part = match segment {
                Segment::Added { id, end } => {
                    ids.push(id);
                    if is_added(id) {
                        checkpoints.push((end, ids.len()));
                    }
                    continue;
                }
                Segment::Text { start, end } => text.get(start..end).unwrap_or_default(),
            };
            let mut emit = |ids: &mut Vec<u32>, piece: &str| {
                if let Some(cached) = pieces.get(piece.as_bytes()) {
                    ids.extend_from_slice(cached);
                    return;
                }
                mapped.clear();
                mapped.extend(piece.bytes().map(|b| self.byte_char[usize::from(b)]));
                match model.tokenize(mapped) {
                    Ok(tokens) => {
                        let first = ids.len();
                        ids.extend(tokens.iter().map(|t| t.id));
                        pieces.insert(piece.as_bytes(), &ids[first..]);
                    }
                    Err(e) => failed = failed.take().or(Some(e)),
                }
            };
            match (&self.kept, splits.split_first_mut(), self.splits.first()) {
                (Some(kept), Some((first, rest)), Some(split))
                    if part.len() >= segment_cache::MIN_TEXT_BYTES =>
                {
                    let start = ids.len();
                    let mut resume = kept.resume(part);
                    split.pieces_until(first, part, &mut |step| match step {
                        Walked::Piece(p) => {
                            self.each_piece(rest, p, 1, &mut |q| emit(&mut ids, q));
                            false
                        }
                        Walked::Restart(at) => resume.stop_at(at, ids.len() - start),
                    });
                    ids.extend_from_slice(resume.rest());
                    if failed.is_none() {
                        kept.keep(part, &ids[start..], resume);
                    }
                }
                _ => self.each_piece(splits, part, 0, &mut |q| emit(&mut ids, q)),
            }
            if failed.is_some() {
                break;
            }
        }
        self.put_scratch(scratch);
        match failed {
            Some(e) => Err(e),
            None => Ok((ids, checkpoints)),
        }
    }

    /// Splits `s` by the patterns from `level` on, calling `f` with each final piece.
    fn each_piece<'s>(
        &self,
        caches: &mut [SplitCaches],
        s: &'s str,
        level: usize,
        f: &mut dyn FnMut(&'s str),
    ) {
        match (self.splits.get(level), caches.split_first_mut()) {
            (Some(split), Some((mine, rest))) => {
                split.pieces(mine, s, &mut |p| self.each_piece(rest, p, level + 1, f));
            }
            _ => f(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pattern: &str, s: &str) -> Vec<String> {
        let split = SplitRegex::new(pattern).unwrap();
        let mut out = Vec::new();
        split.pieces(&mut split.caches(), s, &mut |p| out.push(p.to_owned()));
        out
    }

    const DEEPSEEK: &str =
        r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    /// The byte walk, on the dense DFA and on the lazy one, splits as the `meta` engine
    /// does, on random text for several patterns, including one whose failed attempts would
    /// walk quadratically (`a+b` on `a` runs) and must fall back, and a look-behind one it
    /// must leave alone.
    #[test]
    fn the_byte_walk_splits_as_the_meta_engine_does() {
        let parts = [
            "a", "aa", "b", " ", "  ", "\n", "1", "123", "日本", "é", "!", "'s", "x y",
        ];
        let patterns = [
            DEEPSEEK,
            BYTE_LEVEL_PATTERN,
            r"\p{N}{1,3}",
            r"a+b",
            r"\ba\w*",
        ];
        let mut rng = ownerserve_planner::policy::SplitMix64::new(5);
        for pattern in patterns {
            let walked = SplitRegex::new(pattern).unwrap();
            let mut meta_only = SplitRegex::new(pattern).unwrap();
            meta_only.scan = None;
            meta_only.head_scan = None;
            let lazy = SplitRegex::with_dense_limit(pattern, 0).unwrap();
            assert_eq!(walked.scan.is_some(), !pattern.contains(r"\b"), "{pattern}");
            assert_eq!(
                walked
                    .scan
                    .as_ref()
                    .is_some_and(|s| matches!(s.walk, Walk::Dense { .. })),
                walked.scan.is_some(),
                "{pattern}: every walked pattern here fits a dense DFA"
            );
            assert_eq!(
                lazy.scan
                    .as_ref()
                    .is_some_and(|s| matches!(s.walk, Walk::Lazy(_))),
                walked.scan.is_some(),
                "{pattern}: with no room for a dense DFA, the lazy one"
            );
            let mut texts: Vec<String> = (0..400)
                .map(|i| {
                    (0..1 + i % 60)
                        .map(|_| parts[rng.next_u64() as usize % parts.len()])
                        .collect()
                })
                .collect();
            texts.push(format!("{}b", "a".repeat(5_000)));
            texts.push("a".repeat(5_000));
            for text in texts {
                let split = |r: &SplitRegex| {
                    let mut out = Vec::new();
                    r.pieces(&mut r.caches(), &text, &mut |p| out.push(p.to_owned()));
                    out
                };
                let want = split(&meta_only);
                assert_eq!(split(&walked), want, "{pattern} on {text:?}");
                assert_eq!(split(&lazy), want, "{pattern} on {text:?}, lazily");
            }
        }
    }

    #[test]
    fn the_whitespace_lookahead_gives_back_a_runs_last_space_to_the_next_word() {
        let p = BYTE_LEVEL_PATTERN;
        assert_eq!(pieces(p, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(p, "a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(pieces(p, "a b"), ["a", " b"]);
        assert_eq!(pieces(p, "a   "), ["a", "   "]);
        assert_eq!(pieces(p, "  1"), [" ", " 1"]);
        // `\s*[\r\n]+` (DeepSeek's) takes a run ending in a newline as it is.
        assert_eq!(pieces(DEEPSEEK, "x  \n  y"), ["x", "  \n", " ", " y"]);
        assert_eq!(pieces(DEEPSEEK, "x \n\n"), ["x", " \n\n"]);
    }

    #[test]
    fn other_lookarounds_and_other_pipelines_keep_the_crates_own() {
        assert!(SplitRegex::new(r"a(?=b)|\s+").is_none());
        assert!(SplitRegex::new(r"\p{N}{1,3}").is_some());
        let json = |pre: Value| serde_json::json!({"model": {"type": "BPE"}, "pre_tokenizer": pre});
        let metaspace = json(serde_json::json!({"type": "Metaspace"}));
        assert!(FastEncode::for_tokenizer(&metaspace).is_none());
        let gpt2 = json(
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}),
        );
        assert!(FastEncode::for_tokenizer(&gpt2).is_some());
        let prefixed = json(
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}),
        );
        assert!(FastEncode::for_tokenizer(&prefixed).is_none());
    }

    /// A long text that ends as one tokenized before stops its walk at a restart point
    /// the two share and takes the kept ids from there: the crate's ids, with the local
    /// test tokenizer; a text ending otherwise walks to its end.
    #[test]
    fn a_text_ending_as_a_kept_one_takes_its_ids_from_a_shared_restart_point() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tokenizers/local/tokenizer.json");
        let bytes = std::fs::read(path).unwrap();
        let fast = FastEncode::for_tokenizer(&serde_json::from_slice(&bytes).unwrap()).unwrap();
        let tokenizer = Tokenizer::from_bytes(bytes).unwrap();
        let kept = fast.kept.as_ref().expect("its splits read forward only");
        let stops = || kept.stops.load(std::sync::atomic::Ordering::Relaxed);
        let words = "The quick  brown fox, 42 times;\n\tjumps over 日本 the lazy dog!  ";
        let base = words.repeat(200);
        let at = |n: usize| (n..).find(|&i| base.is_char_boundary(i)).unwrap();
        let texts = [
            base.clone(),
            format!("Another start: {}", &base[at(1000)..]),
            format!("x{}", &base[3..]),
            base.clone(),
            format!("{}, and another end", &base[..at(base.len() - 2000)]),
        ];
        let want_stops = [0, 1, 2, 3, 3];
        for (text, want) in texts.iter().zip(want_stops) {
            let (ids, _) = fast.encode(&tokenizer, text, |_| false).unwrap();
            let crate_ids = tokenizer.encode(text.as_str(), false).unwrap();
            assert_eq!(ids, crate_ids.get_ids(), "{}", &text[..20]);
            assert_eq!(stops(), want, "{}", &text[..20]);
        }
    }

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let table = byte_chars();
        assert_eq!(table[usize::from(b'a')], 'a');
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        let mut sorted = table.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
    }
}
