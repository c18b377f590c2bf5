//! The simulated GPU engine as a black box: a real `ownerserve sim-worker` process.
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Instant;

use common::{chat_body, client, get_json, get_text, metric, words, Proc, MODEL};
use serde_json::{json, Value};

async fn metrics(url: &str) -> String {
    get_text(&format!("{url}/metrics")).await
}

async fn chat(url: &str, body: &Value) -> Value {
    let resp = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// TTFT (simulated seconds) of the one request `run` makes, from the histogram sum.
async fn ttft_of(url: &str, body: &Value) -> (f64, Value) {
    let key = "vllm:time_to_first_token_seconds_sum";
    let before = metric(&metrics(url).await, key);
    let resp = chat(url, body).await;
    (metric(&metrics(url).await, key) - before, resp)
}

#[tokio::test]
async fn a_repeated_prefix_hits_the_cache_and_has_lower_ttft() {
    let w = Proc::sim_worker(&["--instant"]);
    let shared = words("repo", 3000);
    // First sight of the shared prefix.
    let (_, first) = ttft_of(&w.url, &chat_body(&format!("{shared} first question"), 2)).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let hits_before = metric(&metrics(&w.url).await, "vllm:prefix_cache_hits_total");

    // Same prefix, new question; and a cold prompt of the same length.
    let warm_body = chat_body(&format!("{shared} second question"), 2);
    let (warm_ttft, warm) = ttft_of(&w.url, &warm_body).await;
    let cold_body = chat_body(&format!("{} second question", words("cold", 3000)), 2);
    let (cold_ttft, cold) = ttft_of(&w.url, &cold_body).await;

    let prompt = warm["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > prompt * 9 / 10, "cached {cached} of {prompt}");
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let m = metrics(&w.url).await;
    let hits = metric(&m, "vllm:prefix_cache_hits_total") - hits_before;
    assert_eq!(hits as u64, cached);
    assert!(metric(&m, "vllm:prefix_cache_queries_total") >= (3 * prompt) as f64 * 0.9);
    assert!(
        warm_ttft < cold_ttft / 3.0,
        "warm {warm_ttft}s cold {cold_ttft}s"
    );
}

#[tokio::test]
async fn responses_have_openai_shapes_and_exact_usage() {
    let w = Proc::sim_worker(&["--instant"]);
    let mut body = chat_body("count to three", 5);
    body["n"] = json!(3);
    body["temperature"] = json!(0.8);
    let r = chat(&w.url, &body).await;
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], MODEL);
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["finish_reason"], "length");
        assert!(!c["message"]["content"].as_str().unwrap().is_empty());
    }
    assert_ne!(
        choices[0]["message"]["content"],
        choices[1]["message"]["content"]
    );
    let u = &r["usage"];
    assert_eq!(u["completion_tokens"], 15);
    // "<|user|>\ncount to three\n<|assistant|>\n" is 16 pieces with the trace scripts'
    // tokenizer: <| user |> \n coun t ' to' ' thr' ee \n <| assi stan t |> \n
    assert_eq!(u["prompt_tokens"], 16);
    assert_eq!(u["total_tokens"], 31);

    // Text completions, a batch of two prompts, and a stop string.
    let resp = client()
        .post(format!("{}/v1/completions", w.url))
        .json(&json!({"model": MODEL, "prompt": ["a", "b"], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["usage"]["completion_tokens"], 6);

    // Without max_tokens the model stops on its own ("stop"), within its natural length.
    let mut free = chat_body("say something", 1);
    free.as_object_mut().unwrap().remove("max_tokens");
    let r = chat(&w.url, &free).await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let n = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((32..288).contains(&n), "{n}");
    let text = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let stop_word = text.split_whitespace().nth(3).unwrap().to_owned();
    free["stop"] = json!([stop_word.clone()]);
    let r = chat(&w.url, &free).await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let stopped = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        !stopped.contains(&stop_word) && text.starts_with(stopped),
        "{stopped:?} vs {text:?}"
    );
}

#[tokio::test]
async fn streams_use_openai_chunks_and_report_usage() {
    let w = Proc::sim_worker(&["--instant"]);
    let mut body = chat_body("stream please", 6);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = client()
        .post(format!("{}/v1/chat/completions", w.url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(
            c.get("usage").is_some(),
            "usage key on every chunk with include_usage"
        );
    }
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!content.is_empty());
}

#[tokio::test]
async fn metrics_use_vllm_names_and_time_scale_speeds_up_simulated_time() {
    let w = Proc::sim_worker(&["--time-scale", "1000"]);
    let start = Instant::now();
    let mut body = chat_body(&words("w", 2000), 300);
    body["ignore_eos"] = json!(true);
    chat(&w.url, &body).await;
    let wall = start.elapsed().as_secs_f64();
    let m = metrics(&w.url).await;
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:generation_tokens_total{",
        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"",
        "vllm:inter_token_latency_seconds_count{",
        "vllm:e2e_request_latency_seconds_sum{",
        "vllm:cache_config_info{block_size=\"16\"",
    ] {
        assert!(m.contains(name), "missing {name}");
    }
    assert_eq!(metric(&m, "vllm:generation_tokens_total"), 300.0);
    assert_eq!(metric(&m, "vllm:num_requests_running"), 0.0);
    let simulated = metric(&m, "vllm:e2e_request_latency_seconds_sum");
    // 300 decode steps of ~10 simulated ms: about 3 simulated seconds.
    assert!(simulated > 1.0, "simulated {simulated}s");
    assert!(
        simulated / wall > 10.0,
        "simulated {simulated}s took {wall}s of wall time"
    );
}

#[tokio::test]
async fn unknown_models_and_oversized_prompts_are_refused() {
    let w = Proc::sim_worker(&["--instant", "--max-kv-blocks", "64"]);
    let c = client();
    let mut body = chat_body("hi", 2);
    body["model"] = json!("other");
    let resp = c
        .post(format!("{}/v1/chat/completions", w.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let too_long = chat_body(&words("x", 3000), 2);
    let resp = c
        .post(format!("{}/v1/chat/completions", w.url))
        .json(&too_long)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("KV blocks"),
        "{err}"
    );
    let models = get_json(&format!("{}/v1/models", w.url)).await;
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(
        c.get(format!("{}/health", w.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}
