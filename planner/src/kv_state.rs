//! What a prefix's KV state is made of, per state kind, and which parts are sealed.
//!
//! Dense (GQA) and MLA models keep one KV entry per token per layer; the engine seals it
//! in full blocks, and the last partial block is the tail. Hybrid models (DeepSeek-V4
//! style) mix compressed CSA entries (one per `csa_ratio` tokens) with their indexer keys,
//! heavily compressed HCA entries (one per `hca_ratio` tokens), a sliding window of
//! uncompressed KV on every layer, and an uncompressed tail still waiting to be compressed.
//! Sealed parts are transferable artifacts; the tail and the window are what the planner
//! may recompute instead (MISSION.md, "Heterogeneous KV state").

use serde::Serialize;

use crate::spec::{Attention, ModelSpec};

/// One kind of per-request attention state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// Per-token KV (GQA K and V, or MLA latent + RoPE key) on every layer.
    Kv,
    /// Compressed CSA entries, one per `csa_ratio` tokens, on CSA layers.
    CsaMain,
    /// The CSA lightning indexer's keys, one per compressed entry.
    CsaIndexer,
    /// Heavily compressed HCA entries, one per `hca_ratio` tokens, on HCA layers.
    Hca,
    /// Uncompressed KV of the last `swa_window` tokens, on every layer.
    SwaWindow,
    /// Tokens after the last seal boundary: a partial block, or uncompressed entries
    /// waiting for a full compression group.
    Tail,
}

/// The bytes of one state kind for a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StatePart {
    pub kind: StateKind,
    /// Entries per layer.
    pub entries: u64,
    /// Layers holding this kind.
    pub layers: u32,
    pub bytes: f64,
    /// Sealed parts can be stored, shipped and reused as artifacts; the rest is
    /// recomputed (or kept where it is).
    pub sealed: bool,
}

/// A prefix's state, split by kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixState {
    pub tokens: u64,
    /// Tokens covered by sealed artifacts: a multiple of the model's seal unit.
    pub sealed_tokens: u64,
    /// Tokens to recompute when only the sealed parts are reused: the tail, and for
    /// hybrid models the sliding window too.
    pub recompute_tokens: u64,
    pub parts: Vec<StatePart>,
}

impl PrefixState {
    pub fn sealed_bytes(&self) -> f64 {
        bytes_where(&self.parts, |p| p.sealed)
    }

    pub fn unsealed_bytes(&self) -> f64 {
        bytes_where(&self.parts, |p| !p.sealed)
    }

    pub fn total_bytes(&self) -> f64 {
        bytes_where(&self.parts, |_| true)
    }
}

/// A prefix's byte totals: what [`PrefixState::sealed_bytes`] and
/// [`PrefixState::total_bytes`] give, to the bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixBytes {
    pub sealed: f64,
    pub total: f64,
}

fn bytes_where(parts: &[StatePart], pick: impl Fn(&StatePart) -> bool) -> f64 {
    parts.iter().filter(|p| pick(p)).map(|p| p.bytes).sum()
}

impl ModelSpec {
    /// Tokens per sealed unit: the engine's block for dense and MLA models, and for hybrid
    /// ones a block covering `lcm(csa_ratio, hca_ratio)` tokens, so that every compressed
    /// entry of a sealed range is complete.
    pub fn seal_unit(&self, block_size: u32) -> u64 {
        match self.attention {
            Attention::Gqa { .. } | Attention::Mla { .. } => u64::from(block_size.max(1)),
            Attention::Hybrid {
                csa_ratio,
                hca_ratio,
                ..
            } => lcm(u64::from(csa_ratio.max(1)), u64::from(hca_ratio.max(1))),
        }
    }

    /// Of a sealed prefix of `sealed_tokens`, the tokens whose state needs no recompute
    /// when work resumes from it elsewhere: all of them for dense and MLA models; for
    /// hybrid ones all but the last window, which the sealed artifact does not carry.
    pub fn resume_point(&self, sealed_tokens: u64) -> u64 {
        match self.attention {
            Attention::Gqa { .. } | Attention::Mla { .. } => sealed_tokens,
            Attention::Hybrid { swa_window, .. } => {
                sealed_tokens.saturating_sub(u64::from(swa_window))
            }
        }
    }

    /// The state of a `tokens`-long prefix, by kind.
    pub fn prefix_state(&self, tokens: u64, block_size: u32) -> PrefixState {
        self.with_parts(
            tokens,
            block_size,
            |sealed_tokens, recompute_tokens, parts| PrefixState {
                tokens,
                sealed_tokens,
                recompute_tokens,
                parts: parts.to_vec(),
            },
        )
    }

    /// The sealed and total bytes of a `tokens`-long prefix, as [`ModelSpec::prefix_state`]
    /// would sum them, without allocating its parts (the planner asks for them per worker
    /// per step).
    pub fn prefix_bytes(&self, tokens: u64, block_size: u32) -> PrefixBytes {
        self.with_parts(tokens, block_size, |_, _, parts| PrefixBytes {
            sealed: bytes_where(parts, |p| p.sealed),
            total: bytes_where(parts, |_| true),
        })
    }

    /// Calls `f` with a `tokens`-long prefix's sealed tokens, tokens to recompute and
    /// parts, the parts kept on the stack.
    fn with_parts<R>(
        &self,
        tokens: u64,
        block_size: u32,
        f: impl FnOnce(u64, u64, &[StatePart]) -> R,
    ) -> R {
        let unit = self.seal_unit(block_size);
        let sealed_tokens = tokens / unit * unit;
        let tail = tokens - sealed_tokens;
        let el = self.kv_bytes_per_element;
        let part = |kind, entries: u64, layers: u32, elements: f64, sealed| StatePart {
            kind,
            entries,
            layers,
            bytes: entries as f64 * f64::from(layers) * elements * el,
            sealed,
        };
        match self.attention {
            Attention::Gqa { .. } | Attention::Mla { .. } => {
                let per_layer = self.kv_bytes_per_token() / (f64::from(self.layers) * el);
                f(
                    sealed_tokens,
                    tail,
                    &[
                        part(StateKind::Kv, sealed_tokens, self.layers, per_layer, true),
                        part(StateKind::Tail, tail, self.layers, per_layer, false),
                    ],
                )
            }
            Attention::Hybrid {
                csa_layers,
                hca_layers,
                csa_ratio,
                hca_ratio,
                entry_dim,
                indexer_dim,
                swa_window,
            } => {
                let entry = f64::from(entry_dim);
                let window = tokens.min(u64::from(swa_window));
                let csa_entries = sealed_tokens / u64::from(csa_ratio.max(1));
                let hca_entries = sealed_tokens / u64::from(hca_ratio.max(1));
                f(
                    sealed_tokens,
                    tail.max(window),
                    &[
                        part(StateKind::CsaMain, csa_entries, csa_layers, entry, true),
                        part(
                            StateKind::CsaIndexer,
                            csa_entries,
                            csa_layers,
                            f64::from(indexer_dim),
                            true,
                        ),
                        part(StateKind::Hca, hca_entries, hca_layers, entry, true),
                        part(StateKind::SwaWindow, window, self.layers, entry, false),
                        part(StateKind::Tail, tail, csa_layers + hca_layers, entry, false),
                    ],
                )
            }
        }
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

    use super::*;

    #[test]
    fn dense_and_mla_prefixes_seal_full_blocks_and_leave_a_tail() {
        for name in ["llama-3.1-8b", "deepseek-v3"] {
            let m = ModelSpec::preset(name).unwrap();
            let s = m.prefix_state(1000, 16);
            assert_eq!((s.sealed_tokens, s.recompute_tokens), (992, 8), "{name}");
            assert_eq!(s.sealed_bytes(), 992.0 * m.kv_bytes_per_token(), "{name}");
            assert_eq!(s.unsealed_bytes(), 8.0 * m.kv_bytes_per_token(), "{name}");
            assert_eq!(s.total_bytes(), 1000.0 * m.kv_bytes_per_token(), "{name}");
        }
    }

    #[test]
    fn hybrid_prefixes_seal_at_the_common_multiple_of_the_ratios() {
        let m = ModelSpec::preset("hybrid-v4-like").unwrap();
        let Attention::Hybrid {
            csa_layers,
            hca_layers,
            swa_window,
            ..
        } = m.attention
        else {
            panic!("not hybrid")
        };
        assert_eq!(m.seal_unit(16), 128);
        let s = m.prefix_state(1000, 16);
        assert_eq!(s.sealed_tokens, 896);
        assert_eq!(s.recompute_tokens, 104.max(u64::from(swa_window)));
        let entries = |k| s.parts.iter().find(|p| p.kind == k).unwrap().entries;
        assert_eq!(entries(StateKind::CsaMain), 896 / 4);
        assert_eq!(entries(StateKind::CsaIndexer), 896 / 4);
        assert_eq!(entries(StateKind::Hca), 896 / 128);
        assert_eq!(entries(StateKind::SwaWindow), u64::from(swa_window));
        assert_eq!(entries(StateKind::Tail), 104);
        let layers = |k| s.parts.iter().find(|p| p.kind == k).unwrap().layers;
        assert_eq!(layers(StateKind::SwaWindow), m.layers);
        assert_eq!(
            layers(StateKind::CsaMain) + layers(StateKind::Hca),
            csa_layers + hca_layers
        );
        // A short prompt is all window and tail: nothing sealed yet.
        let short = m.prefix_state(100, 16);
        assert_eq!((short.sealed_tokens, short.sealed_bytes()), (0, 0.0));
        assert_eq!(short.recompute_tokens, 100);
    }

    #[test]
    fn sealed_bytes_never_shrink_as_the_prefix_grows() {
        for name in ["llama-3.1-8b", "deepseek-v3", "hybrid-v4-like"] {
            let m = ModelSpec::preset(name).unwrap();
            let mut last = 0.0;
            for tokens in (0..5_000).step_by(7) {
                let s = m.prefix_state(tokens, 16);
                assert!(s.sealed_bytes() >= last, "{name} at {tokens}");
                assert!(s.sealed_tokens <= tokens && s.recompute_tokens <= tokens);
                last = s.sealed_bytes();
            }
        }
    }

    #[test]
    fn the_hybrid_preset_needs_about_a_tenth_of_mla_kv_at_a_million_tokens() {
        // PRESETS.md: at 1M context DeepSeek-V4 needs about 10 % of V3.2's KV cache
        // (V3.2 = V3's MLA cache plus a 128-dim FP8 indexer key per token and layer).
        let hybrid = ModelSpec::preset("hybrid-v4-like").unwrap();
        let v3 = ModelSpec::preset("deepseek-v3").unwrap();
        let tokens = 1_000_000;
        let v32 = v3.prefix_state(tokens, 64).total_bytes() + (tokens * 61 * 128) as f64;
        let ratio = hybrid.prefix_state(tokens, 64).total_bytes() / v32;
        assert!((0.05..0.15).contains(&ratio), "ratio {ratio}");
        // kv_bytes_per_token is the long-run average the roofline uses.
        let per_token = hybrid.kv_bytes_per_token() * tokens as f64;
        let sealed = hybrid.prefix_state(tokens, 64).sealed_bytes();
        assert!((per_token - sealed).abs() / sealed < 0.01);
    }

    #[test]
    fn prefix_bytes_are_the_prefix_states_sums_to_the_bit() {
        for name in ["llama-3.1-8b", "deepseek-v3", "hybrid-v4-like"] {
            let m = ModelSpec::preset(name).unwrap();
            for tokens in (0..300_000).step_by(997) {
                let s = m.prefix_state(tokens, 16);
                let b = m.prefix_bytes(tokens, 16);
                assert_eq!(
                    b.sealed.to_bits(),
                    s.sealed_bytes().to_bits(),
                    "{name} {tokens}"
                );
                assert_eq!(
                    b.total.to_bits(),
                    s.total_bytes().to_bits(),
                    "{name} {tokens}"
                );
            }
        }
    }

    #[test]
    fn lcm_of_ratios() {
        assert_eq!(lcm(4, 128), 128);
        assert_eq!(lcm(4, 6), 12);
        assert_eq!(lcm(1, 1), 1);
    }
}
