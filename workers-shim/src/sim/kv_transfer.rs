//! KV transfer between simulated engines: the wire shapes (vLLM NixlConnector's
//! `kv_transfer_params`, WIRE_FORMATS.md §4.1, plus OwnerServe's pull, fetch and drop
//! bodies) and the link model that prices a transfer.
//!
//! The sim moves no tensors: a pulled block is its hash, its parent hash and its tokens,
//! which is what the receiver's prefix cache and its `BlockStored` events need. Its size is
//! what the model's KV for that block would be, and the link model turns bytes into
//! simulated seconds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use ownerserve_planner::spec::ModelSpec;

/// Link between engines, and how long pinned prefill blocks wait for their decode leg.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferConfig {
    pub link: LinkModel,
    /// Wall-clock lifetime of a prefill leg's pinned blocks (vLLM `kv_lease_duration`).
    pub kv_lease: Duration,
}

/// A transfer costs a fixed latency plus bytes over the bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub bytes_per_s: f64,
    pub latency_s: f64,
}

impl LinkModel {
    /// Simulated seconds to move `bytes` (the latency even for zero bytes).
    pub fn transfer_s(&self, bytes: u64) -> f64 {
        self.latency_s + bytes as f64 / self.bytes_per_s
    }
}

/// KV bytes of one block of `block_size` tokens: the per-token KV of dense and MLA models
/// times the block size; for hybrid models the sealed state (compressed entries and
/// indexer keys) of a span covering whole blocks and whole compression groups, per block.
pub fn block_bytes(model: &ModelSpec, block_size: u32) -> u64 {
    let bs = u64::from(block_size.max(1));
    let unit = model.seal_unit(block_size).max(1);
    let span = unit / gcd(unit, bs) * bs;
    let sealed = model.prefix_state(span, block_size).sealed_bytes();
    (sealed / (span / bs) as f64).round() as u64
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// vLLM's `kv_transfer_params` on a request. Unknown keys (`remote_block_ids`, `tp_size`,
/// ...) are ignored: the sim pulls by block hash, not by the source's block ids.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KvTransferParams {
    #[serde(default)]
    pub do_remote_decode: Option<bool>,
    #[serde(default)]
    pub do_remote_prefill: Option<bool>,
    #[serde(default)]
    pub remote_host: Option<String>,
    #[serde(default)]
    pub remote_port: Option<u16>,
    #[serde(default)]
    pub remote_request_id: Option<String>,
    #[serde(default)]
    pub remote_num_tokens: Option<u64>,
    #[serde(default)]
    pub remote_engine_id: Option<String>,
}

/// Where a decode (or fetch) leg loads its prompt's KV from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFrom {
    pub host: String,
    pub port: u16,
    /// The prefill leg whose pin the pull releases.
    pub request_id: Option<String>,
    /// Prompt tokens the source computed; `None` means the whole prompt.
    pub num_tokens: Option<u64>,
}

/// What a request's `kv_transfer_params` ask of this engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferLegs {
    /// Prefill leg: pin the prompt's blocks and answer with params for the decode leg.
    pub serve_remote_decode: bool,
    /// Decode leg: load the prompt's KV from a source first.
    pub load: Option<LoadFrom>,
}

/// `kv_transfer_params` that ask for something impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("kv_transfer_params with do_remote_prefill needs remote_host and remote_port")]
    NoSource,
}

impl KvTransferParams {
    /// The legs these params ask for.
    pub fn legs(self) -> Result<TransferLegs, ParamsError> {
        let load = if self.do_remote_prefill == Some(true) {
            let (Some(host), Some(port)) = (self.remote_host, self.remote_port) else {
                return Err(ParamsError::NoSource);
            };
            Some(LoadFrom {
                host,
                port,
                request_id: self.remote_request_id,
                num_tokens: self.remote_num_tokens,
            })
        } else {
            None
        };
        Ok(TransferLegs {
            serve_remote_decode: self.do_remote_decode == Some(true),
            load,
        })
    }
}

/// The top-level `kv_transfer_params` of a prefill leg's response, as vLLM's NIXL
/// connector returns them (pull mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvTransferParamsOut {
    pub do_remote_prefill: bool,
    pub do_remote_decode: bool,
    pub remote_block_ids: Vec<u32>,
    pub remote_engine_id: String,
    pub remote_request_id: String,
    pub remote_host: String,
    pub remote_port: u16,
    pub tp_size: u32,
    pub dcp_size: u32,
    pub pp_size: u32,
    pub remote_num_tokens: u64,
    pub remote_blocks_expiry_time: Option<f64>,
    pub transfer_mode: String,
}

/// `POST /ownerserve/v1/kv/pull`: the leading blocks of `block_hashes` the source holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    #[serde(default)]
    pub request_id: Option<String>,
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub epoch: Option<u64>,
}

/// The source's answer to a pull. `parent_block_hash` and `token_ids` are the simulated
/// KV content (an OwnerServe extension): a receiver that does not know the tokens (a
/// migration fetch) needs them to cache the blocks and announce them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullResponse {
    pub blocks: usize,
    pub bytes: u64,
    pub engine_id: String,
    #[serde(default)]
    pub parent_block_hash: Option<u64>,
    #[serde(default)]
    pub token_ids: Vec<u32>,
}

/// `POST /ownerserve/v1/kv/fetch`: pull `block_hashes` from a source into this engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    pub remote_host: String,
    pub remote_port: u16,
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub epoch: Option<u64>,
}

/// Answer to a fetch, sent once the blocks are in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchResponse {
    /// Blocks received from the source.
    pub blocks: usize,
    pub bytes: u64,
    /// Simulated transfer time.
    pub transfer_ms: f64,
    /// Leading blocks of `block_hashes` now cached here (held before, or received).
    pub cached_blocks: usize,
}

/// `POST /ownerserve/v1/kv/drop`: evict blocks (and, with session and epoch, fence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropRequest {
    pub block_hashes: Vec<u64>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub epoch: Option<u64>,
}

/// Answer to a drop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropResponse {
    pub dropped: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_blocks_weigh_kv_per_token_times_block_size_and_hybrids_their_sealed_share() {
        let llama = ModelSpec::preset("llama-3.1-8b").unwrap();
        assert_eq!(block_bytes(&llama, 16), 131_072 * 16);
        let ds = ModelSpec::preset("deepseek-v3").unwrap();
        assert_eq!(block_bytes(&ds, 64), 70_272 * 64);
        let hybrid = ModelSpec::preset("hybrid-v4-like").unwrap();
        let per_block = block_bytes(&hybrid, 16) as f64;
        let expected = hybrid.prefix_state(128, 16).sealed_bytes() / 8.0;
        assert!(per_block > 0.0 && (per_block - expected).abs() <= 1.0);
    }

    #[test]
    fn a_transfer_costs_latency_plus_bytes_over_bandwidth() {
        let link = LinkModel {
            bytes_per_s: 50e9,
            latency_s: 10e-6,
        };
        assert!((link.transfer_s(0) - 10e-6).abs() < 1e-15);
        assert!((link.transfer_s(50_000_000_000) - (1.0 + 10e-6)).abs() < 1e-12);
    }

    #[test]
    fn params_tell_the_legs_apart_and_ignore_unknown_keys() {
        let p = |json: &str| {
            serde_json::from_str::<KvTransferParams>(json)
                .unwrap()
                .legs()
        };
        let prefill = p(
            r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#,
        );
        assert_eq!(
            prefill,
            Ok(TransferLegs {
                serve_remote_decode: true,
                load: None
            })
        );
        let decode = p(
            r#"{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":null,"remote_host":"h","remote_port":9,"tp_size":1,"remote_num_tokens":40,"future_key":{}}"#,
        );
        assert_eq!(
            decode.unwrap().load,
            Some(LoadFrom {
                host: "h".into(),
                port: 9,
                request_id: None,
                num_tokens: Some(40)
            })
        );
        assert_eq!(
            p(r#"{"do_remote_prefill":true}"#),
            Err(ParamsError::NoSource)
        );
        assert_eq!(p("{}"), Ok(TransferLegs::default()));
    }
}
