//! The prompt module's own tests (the prompt service through a step's identity is tested in
//! `proxy::identity`'s tests).

use super::engine_tokenize::{tokenize_request, TokenizeRequest};
use super::hashing::content_key;
use ownerserve_shim::openai::{parse, Endpoint};

#[test]
fn a_content_key_is_the_hash_of_the_first_bytes_in_hex() {
    let body = b"0123456789";
    let key = content_key(&(&body[..], &b""[..], false));
    let hash = xxhash_rust::xxh3::xxh3_64(body);
    assert_eq!(key, format!("#{hash:016x}"));
}

#[test]
fn a_tokenize_request_carries_the_chat_as_sent_and_token_ids_need_none() {
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    let parsed = parse(body, Endpoint::ChatCompletions).unwrap();
    let Some(Ok(request)) = tokenize_request(&parsed) else {
        panic!("a chat has a request");
    };
    assert!(matches!(request, TokenizeRequest::Chat { tools: None, .. }));
    let sent: serde_json::Value = serde_json::to_value(&request).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})
    );
    let body = br#"{"model": "m", "prompt": "hello"}"#;
    let parsed = parse(body, Endpoint::Completions).unwrap();
    let sent = serde_json::to_value(tokenize_request(&parsed).unwrap().unwrap()).unwrap();
    assert_eq!(sent, serde_json::json!({"model": "m", "prompt": "hello"}));
    let body = br#"{"model": "m", "prompt": [1, 2, 3]}"#;
    let parsed = parse(body, Endpoint::Completions).unwrap();
    assert!(matches!(tokenize_request(&parsed), Some(Err(t)) if t == vec![1, 2, 3]));
}
