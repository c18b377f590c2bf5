//! vLLM NixlConnector (pull mode), as `toy_proxy_server.py` and sglang-model-gateway
//! drive it: the prefill leg gets `max_tokens = 1`, no streaming and
//! `kv_transfer_params.do_remote_decode`; the decode leg gets the original request plus
//! the `kv_transfer_params` the prefill returned, unchanged, under the same `X-Request-Id`.

use serde_json::{json, Map, Value};

/// The prefill leg's body: the client's request made to stop after the prefill.
pub fn prefill_request(body: &Value) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null
            }),
        );
        o.insert("stream".into(), Value::Bool(false));
        o.insert("max_tokens".into(), json!(1));
        if o.contains_key("max_completion_tokens") {
            o.insert("max_completion_tokens".into(), json!(1));
        }
        o.remove("stream_options");
        o.remove("min_tokens");
        o.remove("min_completion_tokens");
        if o.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
            o.insert("n".into(), json!(1));
        }
    }
    out
}

/// The `kv_transfer_params` of a prefill leg's response, if it returned any.
pub fn returned_params(response: &Value) -> Option<&Map<String, Value>> {
    response.get("kv_transfer_params")?.as_object()
}

/// The decode leg's body: the client's request plus the prefill's params, unchanged.
pub fn decode_request(body: &Value, params: &Map<String, Value>) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert("kv_transfer_params".into(), Value::Object(params.clone()));
    }
    out
}

/// Where a sealed prefix can be pulled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    pub engine_id: String,
    pub host: String,
    pub port: u16,
    /// Leading prompt tokens to pull.
    pub tokens: u64,
}

/// A request that first pulls a sealed prefix from `source` (the params of a decode leg,
/// with no prefill request behind them: the source serves the blocks from its cache).
pub fn fetch_request(body: &Value, source: &PullSource) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_prefill": true,
                "do_remote_decode": false,
                "remote_engine_id": source.engine_id,
                "remote_block_ids": null,
                "remote_request_id": null,
                "remote_host": source.host,
                "remote_port": source.port,
                "remote_num_tokens": source.tokens,
                "transfer_mode": "pull"
            }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_leg_is_capped_at_one_token_without_streaming() {
        let body = json!({
            "model": "m", "messages": [], "stream": true, "max_tokens": 50,
            "max_completion_tokens": 50, "stream_options": {"include_usage": true},
            "min_tokens": 3, "n": 4, "temperature": 0.5
        });
        let p = prefill_request(&body);
        assert_eq!(p["stream"], false);
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["max_completion_tokens"], 1);
        assert_eq!(p["n"], 1);
        assert!(p.get("stream_options").is_none() && p.get("min_tokens").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(p["temperature"], 0.5);
        // No max_completion_tokens is invented.
        let p = prefill_request(&json!({"model": "m", "prompt": "x"}));
        assert!(p.get("max_completion_tokens").is_none());
    }

    #[test]
    fn the_decode_leg_carries_the_returned_params_unchanged() {
        let resp = json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_block_ids": [[1, 2]], "x": 1}});
        let params = returned_params(&resp).unwrap();
        let body = json!({"model": "m", "prompt": "x", "stream": true});
        let d = decode_request(&body, params);
        assert_eq!(d["kv_transfer_params"], resp["kv_transfer_params"]);
        assert_eq!(d["stream"], true);
        assert!(returned_params(&json!({"choices": []})).is_none());
    }
}
