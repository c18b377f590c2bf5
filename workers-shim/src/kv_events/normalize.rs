//! Wire events → domain [`KvEvent`]s: tokens cut into blocks, `medium` mapped to a tier,
//! events for non-full-attention KV groups (sliding-window layers of hybrid models) dropped.

use ownerserve_planner::kv_index::{KvEvent, Tier};

use super::wire::WireEvent;

/// A wire event that cannot become a domain event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NormalizeError {
    #[error("BlockStored has {tokens} tokens for {blocks} blocks of {block_size}")]
    TokenCount {
        tokens: usize,
        blocks: usize,
        block_size: u32,
    },
    #[error("BlockStored has extra_keys for {keys} blocks but {blocks} blocks")]
    ExtraKeys { keys: usize, blocks: usize },
    #[error("engine block size {engine} differs from the router's {router}")]
    BlockSize { engine: u32, router: usize },
}

/// Converts one wire event. `Ok(None)` means "nothing for the index" (unknown event type,
/// or a KV group the router does not track).
pub fn normalize(ev: WireEvent, block_size: usize) -> Result<Option<KvEvent>, NormalizeError> {
    Ok(Some(match ev {
        WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size: engine_bs,
            lora_name,
            extra_keys,
            medium,
            kv_cache_spec_kind,
            ..
        } => {
            if kv_cache_spec_kind.is_some_and(|k| k != "full_attention") {
                return Ok(None);
            }
            let tier = Tier::from_medium(medium.as_deref());
            // vLLM's CPU offloading connector names offloaded blocks only (no tokens, no
            // parent, block size 0 in some versions): copies of GPU blocks the index knows.
            let names_only = tier != Tier::Gpu && token_ids.is_empty();
            if engine_bs as usize != block_size && !(names_only && engine_bs == 0) {
                return Err(NormalizeError::BlockSize {
                    engine: engine_bs,
                    router: block_size,
                });
            }
            if !names_only && token_ids.len() != block_hashes.len() * block_size {
                return Err(NormalizeError::TokenCount {
                    tokens: token_ids.len(),
                    blocks: block_hashes.len(),
                    block_size: engine_bs,
                });
            }
            if let Some(keys) = extra_keys
                .as_ref()
                .filter(|k| k.len() != block_hashes.len())
            {
                return Err(NormalizeError::ExtraKeys {
                    keys: keys.len(),
                    blocks: block_hashes.len(),
                });
            }
            KvEvent::Stored {
                parent: parent_block_hash,
                block_ids: block_hashes,
                tokens: token_ids,
                tier,
                lora_name,
                extra_keys,
            }
        }
        WireEvent::BlockRemoved {
            block_hashes,
            medium,
            ..
        } => KvEvent::Removed {
            block_ids: block_hashes,
            tier: Tier::from_medium(medium.as_deref()),
        },
        WireEvent::AllBlocksCleared => KvEvent::Cleared,
        WireEvent::Unknown(_) => return Ok(None),
    }))
}
