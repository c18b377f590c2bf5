//! SGLang PD (`pd_router.rs`): the same `bootstrap_host`, `bootstrap_port` and
//! `bootstrap_room` go into the one body sent to both legs at once; a batch (`n > 1`)
//! gets one room per item, as arrays.

use serde_json::{json, Value};

/// Where the prefill worker's bootstrap server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: String,
    /// From the prefill's `/server_info`; `None` is sent as `null`.
    pub port: Option<u16>,
}

/// A room id as SGLang draws it: uniform in `[0, 2^63 - 1]`.
pub fn room(random: u64) -> u64 {
    random & (i64::MAX as u64)
}

/// Items in the request's batch (`n`, at least 1).
pub fn batch_size(body: &Value) -> usize {
    body.get("n")
        .and_then(Value::as_u64)
        .map_or(1, |n| n.max(1) as usize)
}

/// The body both legs receive: the client's plus the bootstrap fields. `rooms` holds one
/// room per batch item.
pub fn with_bootstrap(body: &Value, b: &Bootstrap, rooms: &[u64]) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        if rooms.len() > 1 {
            o.insert(
                "bootstrap_host".into(),
                json!(vec![b.host.clone(); rooms.len()]),
            );
            o.insert("bootstrap_port".into(), json!(vec![b.port; rooms.len()]));
            o.insert("bootstrap_room".into(), json!(rooms));
        } else {
            o.insert("bootstrap_host".into(), json!(b.host));
            o.insert("bootstrap_port".into(), json!(b.port));
            o.insert(
                "bootstrap_room".into(),
                json!(rooms.first().copied().unwrap_or(0)),
            );
        }
    }
    out
}

/// Fields [`with_bootstrap`] adds.
const BOOTSTRAP_FIELDS: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];

/// The client's body again, without the bootstrap fields: what the decode worker runs
/// whole when its prefill partner failed.
pub fn without_bootstrap(body: &Value) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        for k in BOOTSTRAP_FIELDS {
            o.remove(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_gets_scalars_and_a_batch_gets_arrays() {
        let b = Bootstrap {
            host: "10.0.0.1".into(),
            port: Some(8998),
        };
        let one = with_bootstrap(&json!({"model": "m", "text": "x"}), &b, &[7]);
        assert_eq!(one["bootstrap_host"], "10.0.0.1");
        assert_eq!(one["bootstrap_port"], 8998);
        assert_eq!(one["bootstrap_room"], 7);
        let body = json!({"model": "m", "n": 2});
        assert_eq!(batch_size(&body), 2);
        let two = with_bootstrap(&body, &Bootstrap { port: None, ..b }, &[1, 2]);
        assert_eq!(two["bootstrap_port"], json!([null, null]));
        assert_eq!(two["bootstrap_room"], json!([1, 2]));
        assert_eq!(room(u64::MAX), i64::MAX as u64);
        assert_eq!(without_bootstrap(&two), body);
        assert_eq!(without_bootstrap(&one), json!({"model": "m", "text": "x"}));
    }
}
