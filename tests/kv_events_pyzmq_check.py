"""Checks a simulated worker's KV events with real libzmq (pyzmq) and msgspec, decoding
with vLLM's own struct shapes (map-encoded events inside a positional batch).

Usage: python3 kv_events_pyzmq_check.py HTTP_URL EVENTS_ENDPOINT REPLAY_ENDPOINT MODEL
"""
import json
import sys
import time
import urllib.request
from typing import Any, Optional, Union

import msgspec
import zmq

http_url, events_ep, replay_ep, model = sys.argv[1:5]


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


decoder = msgspec.msgpack.Decoder(type=EventBatch)
event_decoder = msgspec.msgpack.Decoder(type=Union[BlockStored, BlockRemoved, AllBlocksCleared])

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(events_ep)
sub.setsockopt(zmq.SUBSCRIBE, b"")
time.sleep(0.3)  # let the subscription reach the publisher

body = json.dumps({"model": model, "messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 2}).encode()
req = urllib.request.Request(http_url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
resp = json.load(urllib.request.urlopen(req, timeout=30))
prompt_tokens = resp["usage"]["prompt_tokens"]

assert sub.poll(10_000), "no KV event arrived"
frames = sub.recv_multipart()
assert len(frames) == 3, frames
seq = int.from_bytes(frames[1], "big")
batch = decoder.decode(frames[2])
stored = [event_decoder.decode(msgspec.msgpack.encode(e)) for e in batch.events]
assert isinstance(stored[0], BlockStored), stored
ev = stored[0]
assert ev.medium == "GPU" and ev.block_size == 16, ev
assert len(ev.token_ids) == 16 * len(ev.block_hashes), ev
assert len(ev.block_hashes) == prompt_tokens // 16, (len(ev.block_hashes), prompt_tokens)

# Replay with a DEALER, exactly as vLLM's protocol specifies.
dealer = ctx.socket(zmq.DEALER)
dealer.connect(replay_ep)
dealer.send_multipart([b"", seq.to_bytes(8, "big")])
replayed = []
while True:
    assert dealer.poll(10_000), "replay timed out"
    parts = dealer.recv_multipart()
    assert parts[0] == b"", parts
    if parts[-2] == b"\xff" * 8 and parts[-1] == b"":
        break
    replayed.append((int.from_bytes(parts[-2], "big"), parts[-1]))
assert replayed and replayed[0] == (seq, frames[2]), replayed[:1]
print("kv events interop checks passed")
