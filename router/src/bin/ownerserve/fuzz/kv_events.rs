//! `kv-events`: an engine's ZMQ message (msgpack `EventBatch`) decoded and normalised.

use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_shim::kv_events::normalize::normalize;
use ownerserve_shim::kv_events::wire::{decode_batch, decode_message};

macro_rules! kv_fixture {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../workers-shim/tests/fixtures/kv_events/",
            $name,
            ".msgpack"
        ))
        .to_vec()
    };
}

pub(super) fn target() -> Target {
    let seeds = vec![
        kv_fixture!("vllm_array_stored"),
        kv_fixture!("vllm_array_removed_cleared"),
        kv_fixture!("vllm_array_stored_child_lora"),
        kv_fixture!("vllm_array_v09_stored"),
        kv_fixture!("vllm_array_v09_removed"),
        kv_fixture!("vllm_map_stored"),
        kv_fixture!("vllm_map_removed_cleared"),
        kv_fixture!("vllm_map_bytes_hashes"),
        kv_fixture!("vllm_map_stored_cpu_sliding"),
        kv_fixture!("vllm_map_stored_image_a"),
        kv_fixture!("vllm_outer_map_stored"),
        kv_fixture!("sglang_array_stored"),
        kv_fixture!("sglang_array_stored_salted"),
        kv_fixture!("sglang_array_removed_cleared"),
        kv_fixture!("sglang_map_stored"),
        kv_fixture!("sglang_map_removed_cleared"),
    ];
    // msgpack type bytes and lengths that stress a decoder.
    let dictionary = vec![
        vec![0xdd, 0xff, 0xff, 0xff, 0xff],
        vec![0xdf, 0x7f, 0xff, 0xff, 0xff],
        vec![0xdb, 0xff, 0xff, 0xff, 0xff],
        vec![0xc6, 0xff, 0xff, 0xff, 0xff],
        vec![0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],
        vec![0x9f],
        vec![0x8f],
        vec![0xc0],
        vec![0xc1],
        b"\xacBlockStored".to_vec(),
        b"\xadBlockRemoved".to_vec(),
        b"\xb0AllBlocksCleared".to_vec(),
        b"\xaablock_size".to_vec(),
    ];
    Target {
        name: "kv-events",
        seeds,
        dictionary,
        run: Box::new(|input| {
            let Ok(batch) = decode_batch(input) else {
                return Verdict::Refused;
            };
            // The whole message as the subscriber gets it, too.
            let seq = 7u64.to_be_bytes();
            #[expect(
                clippy::expect_used,
                reason = "the fuzzer's oracle: a panic here is the finding it reports"
            )]
            let msg = decode_message(&[&b"kv-events"[..], &seq[..], input])
                .expect("a batch that decodes alone decodes in its message");
            assert_eq!(msg.seq, 7);
            for ev in batch.events {
                for block_size in [16, 32] {
                    let _ = normalize(ev.clone(), block_size);
                }
            }
            Verdict::Accepted
        }),
    }
}
