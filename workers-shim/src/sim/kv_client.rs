//! The receiving side of a KV transfer: `POST /ownerserve/v1/kv/pull` to the source
//! engine, with the session's fence headers, and a checked answer.

use std::time::Duration;

use super::fence::{FenceClaim, EPOCH_HEADER, SESSION_HEADER};
use super::kv_transfer::{PullRequest, PullResponse};

/// Path of the pull endpoint on every simulated engine.
pub const PULL_PATH: &str = "/ownerserve/v1/kv/pull";

/// A pull that brought nothing usable; the caller recomputes instead.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("cannot reach the KV source at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the KV source at {url} answered {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the KV source at {url} sent an unreadable answer")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the KV source at {url} claims {blocks} blocks of the {asked} asked")]
    TooMany {
        url: String,
        blocks: usize,
        asked: usize,
    },
    #[error("the KV source at {url} sent {tokens} tokens for {blocks} blocks")]
    TokenCount {
        url: String,
        tokens: usize,
        blocks: usize,
    },
}

/// HTTP client for pulls, shared by every request of one engine.
#[derive(Debug, Clone)]
pub struct KvClient {
    http: reqwest::Client,
}

impl KvClient {
    /// A client whose pulls give up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .build()
            .unwrap_or_default();
        Self { http }
    }

    /// Asks `host:port` for the leading blocks of `request.block_hashes` it holds, each of
    /// `block_size` tokens.
    pub async fn pull(
        &self,
        host: &str,
        port: u16,
        request: &PullRequest,
        claim: Option<&FenceClaim>,
        block_size: usize,
    ) -> Result<PullResponse, PullError> {
        let url = pull_url(host, port);
        let mut call = self.http.post(&url).json(request);
        if let Some(c) = claim {
            call = call
                .header(SESSION_HEADER, c.session.as_str())
                .header(EPOCH_HEADER, c.epoch.to_string());
        }
        let unreachable = |source| PullError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = call.send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(PullError::Refused {
                url,
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).chars().take(512).collect(),
            });
        }
        let answer: PullResponse =
            serde_json::from_slice(&body).map_err(|source| PullError::Decode {
                url: url.clone(),
                source,
            })?;
        if answer.blocks > request.block_hashes.len() {
            return Err(PullError::TooMany {
                url,
                blocks: answer.blocks,
                asked: request.block_hashes.len(),
            });
        }
        if answer.token_ids.len() != answer.blocks * block_size {
            return Err(PullError::TokenCount {
                url,
                tokens: answer.token_ids.len(),
                blocks: answer.blocks,
            });
        }
        Ok(answer)
    }
}

/// `http://host:port/ownerserve/v1/kv/pull`, bracketing a bare IPv6 address.
fn pull_url(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("http://[{host}]:{port}{PULL_PATH}")
    } else {
        format!("http://{host}:{port}{PULL_PATH}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(
            pull_url("127.0.0.1", 80),
            "http://127.0.0.1:80/ownerserve/v1/kv/pull"
        );
        assert_eq!(pull_url("::1", 80), "http://[::1]:80/ownerserve/v1/kv/pull");
        assert_eq!(
            pull_url("[::1]", 80),
            "http://[::1]:80/ownerserve/v1/kv/pull"
        );
    }
}
