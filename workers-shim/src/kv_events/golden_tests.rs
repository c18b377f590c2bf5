//! Golden tests: byte fixtures produced by msgspec from the upstream struct definitions
//! (`tests/fixtures/kv_events/generate.py`), decoded by our codec.

use super::normalize::normalize;
use super::wire::{decode_batch, decode_message, encode_batch, DecodeError, Encoding, WireEvent};
use ownerserve_planner::kv_index::{KvEvent, Tier};

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kv_events/",
            $name,
            ".msgpack"
        ))
        .as_slice()
    };
}

const H0: u64 = 0x1122334455667788;
const H1: u64 = 15760518052499183552;
const S0: u64 = 8635429971592222890;
const S1: u64 = (-1256577331724852459_i64) as u64;

fn stored(
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    medium: Option<&str>,
) -> WireEvent {
    WireEvent::BlockStored {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: 4,
        lora_name: None,
        extra_keys: None,
        medium: medium.map(str::to_owned),
        group_idx: None,
        kv_cache_spec_kind: None,
    }
}

fn removed(hashes: Vec<u64>, medium: Option<&str>) -> WireEvent {
    WireEvent::BlockRemoved {
        block_hashes: hashes,
        medium: medium.map(str::to_owned),
        group_idx: None,
    }
}

#[test]
fn vllm_stored_decodes_identically_in_every_encoding() {
    let expected = vec![stored(vec![H0, H1], None, (1..=8).collect(), Some("GPU"))];
    for bytes in [
        fixture!("vllm_array_stored"),
        fixture!("vllm_map_stored"),
        fixture!("vllm_outer_map_stored"),
    ] {
        let b = decode_batch(bytes).unwrap();
        assert_eq!(b.ts, 1.5);
        assert_eq!(b.dp_rank, Some(0));
        assert_eq!(b.events, expected);
    }
    // vLLM ~0.9: no medium, no dp rank.
    let old = decode_batch(fixture!("vllm_array_v09_stored")).unwrap();
    assert_eq!(old.dp_rank, None);
    assert_eq!(
        old.events,
        vec![stored(vec![H0, H1], None, (1..=8).collect(), None)]
    );
}

#[test]
fn vllm_trailing_fields_lora_and_groups_are_read() {
    let b = decode_batch(fixture!("vllm_array_stored_child_lora")).unwrap();
    assert_eq!(b.dp_rank, Some(1));
    assert_eq!(
        b.events,
        vec![WireEvent::BlockStored {
            block_hashes: vec![H1 ^ 1],
            parent_block_hash: Some(H1),
            token_ids: (9..=12).collect(),
            block_size: 4,
            lora_name: Some("my-lora".into()),
            extra_keys: None,
            medium: Some("GPU".into()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
        }]
    );
    let b = decode_batch(fixture!("vllm_map_stored_cpu_sliding")).unwrap();
    let events: Vec<_> = b
        .events
        .into_iter()
        .map(|e| normalize(e, 4).unwrap())
        .collect();
    assert!(matches!(
        &events[0],
        Some(KvEvent::Stored {
            tier: Tier::Cpu,
            ..
        })
    ));
    assert_eq!(events[1], None, "sliding-window groups are not indexed");
}

#[test]
fn vllm_removed_and_cleared_decode_in_both_encodings() {
    let expected = vec![
        removed(vec![H0, H1], Some("GPU")),
        WireEvent::AllBlocksCleared,
    ];
    for bytes in [
        fixture!("vllm_array_removed_cleared"),
        fixture!("vllm_map_removed_cleared"),
    ] {
        let b = decode_batch(bytes).unwrap();
        assert_eq!(b.ts, 2.0);
        assert_eq!(b.dp_rank, None);
        assert_eq!(b.events, expected);
    }
    let old = decode_batch(fixture!("vllm_array_v09_removed")).unwrap();
    assert_eq!(old.events, vec![removed(vec![H1], None)]);
}

#[test]
fn digest_hashes_use_their_last_eight_bytes_big_endian() {
    let b = decode_batch(fixture!("vllm_map_bytes_hashes")).unwrap();
    let WireEvent::BlockStored { block_hashes, .. } = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(block_hashes, &vec![0x18191a1b1c1d1e1f, 0x38393a3b3c3d3e3f]);
}

#[test]
fn sglang_signed_hashes_dp_rank_and_metadata_decode() {
    let expected = vec![
        stored(vec![S0], None, (1..=4).collect(), None),
        stored(vec![S1], Some(S0), (5..=8).collect(), None),
    ];
    let b = decode_batch(fixture!("sglang_array_stored")).unwrap();
    assert_eq!(b.dp_rank, Some(2), "attn_dp_rank is the third batch field");
    assert_eq!(b.events, expected);
    let b = decode_batch(fixture!("sglang_map_stored")).unwrap();
    assert_eq!(b.dp_rank, Some(3));
    let with_gpu: Vec<_> = expected
        .into_iter()
        .map(|e| match e {
            WireEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                ..
            } => stored(block_hashes, parent_block_hash, token_ids, Some("GPU")),
            other => other,
        })
        .collect();
    assert_eq!(b.events, with_gpu, "cache_salt and session_id are skipped");
    // The salted legacy form puts a metadata map where vLLM has lora_name.
    let b = decode_batch(fixture!("sglang_array_stored_salted")).unwrap();
    assert_eq!(
        b.events,
        vec![stored(vec![S0], None, (1..=4).collect(), Some("GPU"))]
    );
}

#[test]
fn sglang_removed_and_cleared_decode_in_both_encodings() {
    for (bytes, medium) in [
        (fixture!("sglang_array_removed_cleared"), None),
        (fixture!("sglang_map_removed_cleared"), Some("GPU")),
    ] {
        let b = decode_batch(bytes).unwrap();
        assert_eq!(
            b.events,
            vec![removed(vec![S1], medium), WireEvent::AllBlocksCleared]
        );
    }
}

#[test]
fn our_encoder_writes_exactly_what_msgspec_writes() {
    for (bytes, enc) in [
        (fixture!("vllm_array_stored"), Encoding::Array),
        (fixture!("vllm_map_stored"), Encoding::Map),
        (fixture!("vllm_array_removed_cleared"), Encoding::Array),
        (fixture!("vllm_map_removed_cleared"), Encoding::Map),
    ] {
        let batch = decode_batch(bytes).unwrap();
        assert_eq!(encode_batch(&batch, enc), bytes, "{enc:?}");
    }
}

#[test]
fn frames_are_checked_and_garbage_never_panics() {
    let payload = fixture!("vllm_map_stored");
    let msg = decode_message(&[b"kv".as_slice(), &7u64.to_be_bytes(), payload]).unwrap();
    assert_eq!(msg.seq, 7);
    assert_eq!(
        decode_message(&[b"kv".as_slice(), payload]),
        Err(DecodeError::FrameCount(2))
    );
    assert_eq!(
        decode_message(&[b"kv".as_slice(), &[1, 2], payload]),
        Err(DecodeError::SeqFrame(2))
    );
    // Every truncation and every single-byte corruption of real payloads: errors, no panic.
    for bytes in [
        fixture!("vllm_array_stored_child_lora"),
        fixture!("vllm_map_stored_cpu_sliding"),
        fixture!("sglang_map_stored"),
    ] {
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..bytes.len() {
            for flip in [0x00, 0xff, 0xc1, 0xdd, 0x9f] {
                let mut b = bytes.to_vec();
                b[i] = flip;
                let _ = decode_batch(&b);
            }
        }
    }
}

#[test]
fn normalize_cuts_tokens_into_blocks_and_checks_sizes() {
    let b = decode_batch(fixture!("vllm_map_stored")).unwrap();
    let ev = normalize(b.events[0].clone(), 4).unwrap().unwrap();
    let KvEvent::Stored {
        block_ids,
        tokens,
        tier,
        parent,
        ..
    } = ev
    else {
        panic!()
    };
    assert_eq!((tier, parent), (Tier::Gpu, None));
    assert_eq!(block_ids, vec![H0, H1]);
    assert_eq!(tokens, (1..=8).collect::<Vec<u32>>());
    assert!(normalize(b.events[0].clone(), 16).is_err());
}

#[test]
fn blocks_with_multimodal_extra_keys_chain_apart_from_text_and_from_each_other() {
    use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
    use ownerserve_planner::ids::WorkerId;
    use ownerserve_planner::kv_index::{KvIndex, KvIndexConfig};
    let event = |payload: &[u8]| {
        let ev = decode_batch(payload).unwrap().events.remove(0);
        normalize(ev, 4).unwrap().unwrap()
    };
    let (a, b) = (
        event(fixture!("vllm_map_stored_image_a")),
        event(fixture!("vllm_map_stored_image_b")),
    );
    let KvEvent::Stored { extra_keys, .. } = &a else {
        panic!("{a:?}")
    };
    let keys = extra_keys.as_ref().unwrap();
    assert_eq!(keys[0], 0, "the first block has none");
    assert_ne!(keys[1], 0);
    let text = normalize(
        decode_batch(fixture!("vllm_map_stored"))
            .unwrap()
            .events
            .remove(0),
        4,
    )
    .unwrap()
    .unwrap();
    let mut index = KvIndex::new(KvIndexConfig {
        block_size: 4,
        ..KvIndexConfig::default()
    });
    for (w, ev) in [(0, &a), (1, &b), (2, &text)] {
        index.apply(WorkerId(w), ev).unwrap();
    }
    // A text prompt of the same token ids: all of it on the text worker, only the block
    // before the image on the others.
    let tokens: Vec<u32> = (1..=8).collect();
    let mut got = index.find_matches_linear(&prompt_hashes(&tokens, 4, XXH3_SEED));
    got.sort_by_key(|m| m.worker);
    let gpu: Vec<(u32, u32)> = got.iter().map(|m| (m.worker.0, m.gpu_blocks)).collect();
    assert_eq!(gpu, [(0, 1), (1, 1), (2, 2)]);
    // Three distinct second blocks: image a, image b, text.
    assert_eq!(index.len(), 4);
}

#[test]
fn cpu_offload_events_decode_to_host_holds_in_the_index() {
    use super::wire::WireBatch;
    use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
    use ownerserve_planner::ids::WorkerId;
    use ownerserve_planner::kv_index::{KvIndex, KvIndexConfig};
    // What vLLM's OffloadingConnector publishes: the offloaded blocks by id only (no parent,
    // no tokens, block size 0 in some versions), then the GPU eviction; here through our
    // encoder and decoder, in both layouts.
    let mut offloaded = stored(vec![H1], None, Vec::new(), Some("CPU"));
    if let WireEvent::BlockStored { block_size, .. } = &mut offloaded {
        *block_size = 0;
    }
    let batch = WireBatch {
        ts: 1.0,
        events: vec![
            stored(vec![H0, H1], None, (1..=8).collect(), Some("GPU")),
            offloaded,
            removed(vec![H1], Some("GPU")),
        ],
        dp_rank: Some(0),
    };
    for enc in [Encoding::Map, Encoding::Array] {
        let decoded = decode_batch(&encode_batch(&batch, enc)).unwrap();
        let events: Vec<KvEvent> = decoded
            .events
            .into_iter()
            .map(|e| normalize(e, 4).unwrap().unwrap())
            .collect();
        assert!(
            matches!(&events[1], KvEvent::Stored { tier: Tier::Cpu, tokens, .. } if tokens.is_empty()),
            "{enc:?}: {:?}",
            events[1]
        );
        let mut index = KvIndex::new(KvIndexConfig {
            block_size: 4,
            ..KvIndexConfig::default()
        });
        for ev in &events {
            index.apply(WorkerId(0), ev).unwrap();
        }
        let got =
            index.find_matches_linear(&prompt_hashes(&(1..=8).collect::<Vec<u32>>(), 4, XXH3_SEED));
        // One block in HBM, the second restorable from host memory.
        assert_eq!((got[0].gpu_blocks, got[0].any_blocks), (1, 2), "{enc:?}");
        assert_eq!(index.gpu_replication().copies, 1);
    }
}
