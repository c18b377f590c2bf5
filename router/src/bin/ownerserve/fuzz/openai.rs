//! `openai`: a client body through the OpenAI parser of every proxied endpoint (the rows
//! of `api::ENDPOINTS` the proxy serves).

use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_shim::openai;

use super::{tokens, JSON_TOKENS};

pub(super) fn target() -> Target {
    let seeds = [
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#,
        r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"stream":true,"n":2,"temperature":0.5,"user":"u","metadata":{"session_id":"s"}}"#,
        r#"{"model":"m","prompt":"once upon","max_tokens":16,"n":1,"stream":false}"#,
        r#"{"model":"m","prompt":[1,2,3,4],"max_tokens":1}"#,
        r#"{"model":"m","prompt":["a","b"],"n":3,"max_tokens":2,"kv_transfer_params":{"do_remote_prefill":true}}"#,
        r#"{"model":"m","prompt":[[1,2],[3]],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"model":"m","max_tokens":8,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]}],"tools":[{"name":"f","input_schema":{}}],"metadata":{"user_id":"{\"session_id\":\"s\"}"}}"#,
        r#"{"model":"m","instructions":"i","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f"}],"store":true,"previous_response_id":"resp_1","max_output_tokens":4}"#,
    ];
    let mut dictionary = tokens(JSON_TOKENS);
    dictionary.extend(tokens(&[
        "\"model\"",
        "\"messages\"",
        "\"prompt\"",
        "\"n\"",
        "\"max_tokens\"",
        "\"stream\"",
        "\"role\"",
        "\"content\"",
        "\"tools\"",
        "\"kv_transfer_params\"",
        "\"bootstrap_host\"",
        "\"metadata\"",
        "\"user\"",
        "\"tool_calls\"",
        "\"max_completion_tokens\"",
        "\"system\"",
        "\"input\"",
        "\"instructions\"",
        "\"tool_use\"",
        "\"tool_result\"",
        "\"function_call\"",
        "\"previous_response_id\"",
    ]));
    Target {
        name: "openai",
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        dictionary,
        run: Box::new(|input| {
            let mut verdict = Verdict::Refused;
            for endpoint in ownerserve_router::api::endpoints::proxied() {
                if let Ok(parsed) = openai::parse(input, endpoint) {
                    // What ingress reads of an accepted request.
                    let _ = (parsed.choices(), parsed.engine_control, &parsed.model);
                    verdict = Verdict::Accepted;
                }
            }
            verdict
        }),
    }
}
