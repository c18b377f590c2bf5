//! The operator API's HTTP calls for `ctl`, and its errors in words.

use std::time::Duration;

use anyhow::{bail, Context};
use axum::http::Method;
use serde_json::Value;

/// How long a backup may take to arrive (a large directory's state is hundreds of MB).
const BACKUP_TIMEOUT: Duration = Duration::from_secs(600);

/// A client for one server's `/admin/v1`.
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// A path segment with the characters that would change the path escaped.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// A client for the server at `url` (`http://host:port`).
    pub fn new(url: &str, token: Option<String>) -> anyhow::Result<Self> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            bail!("--url `{url}` must start with http:// or https://");
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// GETs `path`.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(Method::GET, path, None, &[]).await
    }

    /// GETs `path` and returns the answer's bytes as they came (a backup is written as
    /// the server sent it).
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.get(&url).timeout(BACKUP_TIMEOUT);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .with_context(|| format!("{url}: the answer was cut off"))?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        bail!(
            "{}",
            explain_error(status.as_u16(), &value, self.token.is_some())
        )
    }

    /// Calls `path` with an optional JSON body and extra headers; a non-2xx answer is an
    /// error saying what it means.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(axum::http::HeaderName, String)],
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let method = reqwest::Method::from_bytes(method.as_str().as_bytes())
            .context("unsupported method")?;
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(k.as_str(), v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .with_context(|| format!("{url}: the answer was cut off"))?;
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok(value);
        }
        bail!(
            "{}",
            explain_error(status.as_u16(), &value, self.token.is_some())
        )
    }
}

/// What an error answer means, for a person.
fn explain_error(status: u16, body: &Value, had_token: bool) -> String {
    let message = body["error"]["message"]
        .as_str()
        .or_else(|| body.as_str())
        .unwrap_or("")
        .to_owned();
    let hint = match status {
        401 if !had_token => {
            "no token given: pass --token or set OWNERSERVE_ADMIN_TOKEN (printed by the server at start)".to_owned()
        }
        401 => "the token was not accepted".to_owned(),
        403 => "this token may only read; writes need the admin token".to_owned(),
        404 if message.is_empty() || message.starts_with("no route for") => {
            "this server has no such route (`workers`, `drain` and `explain` need the router, not a directory node; `directory backup` a directory node, or a router that embeds one)".to_owned()
        }
        421 => format!(
            "not the directory leader; try the leader at {}",
            body["leader_addr"].as_str().unwrap_or("an unknown address")
        ),
        _ => String::new(),
    };
    match (message.is_empty(), hint.is_empty()) {
        (true, true) => format!("the server answered {status}"),
        (false, true) => format!("the server answered {status}: {message}"),
        (true, false) => format!("the server answered {status}: {hint}"),
        (false, false) => format!("the server answered {status}: {message} ({hint})"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn errors_name_the_status_the_message_and_what_to_do() {
        let body = json!({"error": {"message": "missing or unknown bearer token"}});
        let e = explain_error(401, &body, false);
        assert!(
            e.contains("401") && e.contains("OWNERSERVE_ADMIN_TOKEN"),
            "{e}"
        );
        assert!(explain_error(403, &Value::Null, true).contains("only read"));
        let e = explain_error(404, &json!({"error": {"message": "no session s"}}), true);
        assert_eq!(e, "the server answered 404: no session s");
        let e = explain_error(
            404,
            &json!({"error": {"message": "no route for GET /x"}}),
            true,
        );
        assert!(e.contains("need the router"), "{e}");
        assert_eq!(
            explain_error(500, &Value::Null, true),
            "the server answered 500"
        );
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(segment("agent-1/fork-2 x"), "agent-1%2Ffork-2%20x");
    }
}
