//! Engine KV events in domain form: what the shim's decoders produce from vLLM/SGLang wire
//! formats, and what router replicas exchange over Redis Streams.

use serde::{Deserialize, Serialize};

/// Where a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Gpu = 0,
    Cpu = 1,
    Disk = 2,
}

impl Tier {
    /// The tier an engine's `medium` string names; no medium means the engine's own GPU
    /// cache (vLLM before `medium` existed).
    pub fn from_medium(medium: Option<&str>) -> Tier {
        match medium.map(str::to_ascii_lowercase).as_deref() {
            None | Some("gpu") | Some("cuda") | Some("hbm") => Tier::Gpu,
            Some("cpu") | Some("cpu_tier") | Some("host") => Tier::Cpu,
            Some(_) => Tier::Disk,
        }
    }
}

/// A change to what one worker holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvEvent {
    /// Blocks were cached, chained under `parent` (an engine block id) or at the root.
    /// `tokens` holds every block's tokens back to back (`block_ids.len() × block_size`).
    Stored {
        parent: Option<u64>,
        block_ids: Vec<u64>,
        tokens: Vec<u32>,
        tier: Tier,
        lora_name: Option<String>,
        /// Per block, a fingerprint of the engine's `extra_keys` (multimodal inputs' hashes,
        /// cache salt), 0 for none: blocks with extra keys chain apart from plain text with
        /// the same token ids (an image's placeholder tokens are the same for every image).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra_keys: Option<Vec<u64>>,
    },
    /// Blocks (engine ids) were evicted from `tier`.
    Removed { block_ids: Vec<u64>, tier: Tier },
    /// The engine dropped its whole cache.
    Cleared,
}
