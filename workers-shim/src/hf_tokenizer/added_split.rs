//! Splitting a text at a tokenizer's added tokens (the special tokens a chat template puts
//! around every message), as the `tokenizers` crate's `AddedVocabulary` does for a
//! tokenizer without a normalizer, without its per-byte offset bookkeeping (a
//! `NormalizedString` keeps two offsets per byte of the text, and every split copies them).
//!
//! The crate matches the tokens marked `normalized: false` first, leftmost-longest, then
//! those marked `normalized: true` in the text between: so does this. Tokens that strip
//! spaces around them or match single words only (`lstrip`, `rstrip`, `single_word`) are
//! left to the crate.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde_json::Value;

/// One pass of the split: a leftmost-longest matcher and the id of each of its patterns.
#[derive(Debug)]
struct Pass {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

impl Pass {
    fn new(tokens: &[(String, u32)]) -> Option<Self> {
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(content, _)| content))
            .ok()?;
        Some(Self {
            matcher,
            ids: tokens.iter().map(|&(_, id)| id).collect(),
        })
    }
}

/// A piece of a split text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Segment {
    /// An added token, ending at byte `end`.
    Added { id: u32, end: usize },
    /// Text between added tokens, `text[start..end]`.
    Text { start: usize, end: usize },
}

/// A tokenizer's added tokens, ready to split texts at.
#[derive(Debug)]
pub(super) struct AddedSplit {
    raw: Pass,
    normalized: Pass,
}

impl AddedSplit {
    /// From a `tokenizer.json`'s `added_tokens`; `None` when one of them needs what the
    /// crate does beyond plain matching.
    pub(super) fn for_tokenizer(json: &Value) -> Option<Self> {
        let (mut raw, mut normalized) = (Vec::new(), Vec::new());
        for t in json.get("added_tokens")?.as_array()? {
            let flag = |k: &str| t.get(k).and_then(Value::as_bool).unwrap_or(false);
            if flag("lstrip") || flag("rstrip") || flag("single_word") {
                return None;
            }
            let content = t.get("content")?.as_str()?.to_owned();
            let id = u32::try_from(t.get("id")?.as_u64()?).ok()?;
            match flag("normalized") {
                true => normalized.push((content, id)),
                false => raw.push((content, id)),
            }
        }
        Some(Self {
            raw: Pass::new(&raw)?,
            normalized: Pass::new(&normalized)?,
        })
    }

    /// `text`'s segments, in order.
    pub(super) fn split(&self, text: &str, out: &mut Vec<Segment>) {
        let mut from = 0;
        for m in self.raw.matcher.find_iter(text) {
            self.split_normalized(text, from, m.start(), out);
            out.push(Segment::Added {
                id: self.raw.ids[m.pattern().as_usize()],
                end: m.end(),
            });
            from = m.end();
        }
        self.split_normalized(text, from, text.len(), out);
    }

    /// The segments of `text[start..end]`, which holds none of the raw tokens.
    fn split_normalized(&self, text: &str, start: usize, end: usize, out: &mut Vec<Segment>) {
        let mut from = start;
        for m in self.normalized.matcher.find_iter(&text[start..end]) {
            let (m_start, m_end) = (start + m.start(), start + m.end());
            if from < m_start {
                out.push(Segment::Text {
                    start: from,
                    end: m_start,
                });
            }
            out.push(Segment::Added {
                id: self.normalized.ids[m.pattern().as_usize()],
                end: m_end,
            });
            from = m_end;
        }
        if from < end {
            out.push(Segment::Text { start: from, end });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(json: Value, text: &str) -> Vec<Segment> {
        let mut out = Vec::new();
        AddedSplit::for_tokenizer(&json)
            .unwrap()
            .split(text, &mut out);
        out
    }

    #[test]
    fn raw_tokens_match_first_and_longest_then_normalized_ones_between() {
        let json = serde_json::json!({"added_tokens": [
            {"id": 1, "content": "<a>", "normalized": false},
            {"id": 2, "content": "<a><b>", "normalized": false},
            {"id": 3, "content": "b>x", "normalized": true},
            {"id": 4, "content": "zz", "normalized": true},
        ]});
        use Segment::{Added, Text};
        assert_eq!(
            split(json.clone(), "q<a><b>xzz<a>b>x"),
            [
                Text { start: 0, end: 1 },
                Added { id: 2, end: 7 },
                Text { start: 7, end: 8 },
                Added { id: 4, end: 10 },
                Added { id: 1, end: 13 },
                Added { id: 3, end: 16 },
            ]
        );
        assert!(split(json, "").is_empty());
        let stripping = serde_json::json!({"added_tokens": [
            {"id": 1, "content": "<a>", "normalized": false, "lstrip": true},
        ]});
        assert!(AddedSplit::for_tokenizer(&stripping).is_none());
    }
}
