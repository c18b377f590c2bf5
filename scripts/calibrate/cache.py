"""L1 of issue 63: the simulator's cache decisions against a real engine's, deterministic.

One real vLLM (CPU) and one `ownerserve sim-worker` get the same KV pool (block 32) and the
same scripted prompts, one at a time: shared repository prefixes, sessions that grow turn by
turn, branches off earlier prompts, exact and block-aligned repeats, long prompts that flush
the pool, short ones, a few with decoded tokens. Per request it compares
`usage.prompt_tokens_details.cached_tokens`, and the blocks each engine stored and removed
(its KV events, named by content: `engines.Canon`). Prints each mismatch and the shares;
exits 1 below the bars (99% of requests, 99% of eviction events).

usage: /tmp/vllm-venv/bin/python scripts/calibrate/cache.py --ownerserve target/debug/ownerserve
"""

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import time

import engines

BAR = 0.99
VOCAB = (4, 4096)


def script(seed, n, max_len):
    """`n` prompts (token ids) and their `max_tokens`, built to overflow a ~3K-token pool."""
    rng = random.Random(seed)

    def toks(k):
        return [rng.randrange(*VOCAB) for _ in range(k)]

    repos = [toks(rng.randrange(200, 900)) for _ in range(6)]
    sessions, out = [], []
    while len(out) < n:
        r = rng.random()
        if r < 0.25 or not sessions:  # a new session on a repository
            p = rng.choice(repos) + toks(rng.randrange(20, 500))
            sessions.append(p)
        elif r < 0.55:  # a session's next turn
            i = rng.randrange(len(sessions))
            p = sessions[i] + toks(rng.randrange(10, 300))
            sessions[i] = p
        elif r < 0.65:  # a branch off an earlier prompt
            base = rng.choice(out)[0]
            p = base[:rng.randrange(1, len(base) + 1)] + toks(rng.randrange(5, 200))
        elif r < 0.75:  # an exact repeat
            p = list(rng.choice(out)[0])
        elif r < 0.82:  # a block-aligned repeat (the engine recomputes its last block)
            base = rng.choice(out)[0]
            k = len(base) // engines.BLOCK * engines.BLOCK
            p = base[:k] if k else base
        elif r < 0.92:  # a long one that flushes the pool
            p = toks(rng.randrange(1200, 1900))
        else:  # a short one
            p = toks(rng.randrange(5, 60))
        if len(p) + 80 > max_len:
            sessions = [s for s in sessions if s is not p]
            continue
        decode = 1 if rng.random() < 0.8 else rng.randrange(8, 70)
        out.append((p, decode))
    return out


def run_one(engine, tap, canon, prompt, max_tokens):
    mark = tap.count()
    body = {"model": engines.MODEL, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0}
    resp = engines.post(engine.url + "/v1/completions", body)
    end = tap.quiet()
    stored, removed = collections.Counter(), collections.Counter()
    for ev in tap.since(mark)[:end - mark]:
        k = engines.kind(ev)
        if k == "BlockStored":
            stored.update(canon.stored(ev))
        elif k == "BlockRemoved":
            removed.update(canon.removed(ev))
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"], stored, removed


def drive(engine, prompts):
    tap = engines.Tap(engine.zmq)
    time.sleep(1.0)  # a SUB socket joins late: nothing is published before the first prompt
    canon = engines.Canon(engines.prompt_chain_keys([p for p, _ in prompts]))
    rows = [run_one(engine, tap, canon, p, d) for p, d in prompts]
    tap.close()
    return rows, tap.gaps


def compare(prompts, real, sim):
    """Per request: cached tokens equal; per eviction (a removed block of a request): in the
    other engine's removals of that request too."""
    cached_ok, evict_total, evict_ok, store_ok, lines = 0, 0, 0, 0, []
    for i, ((p, d), a, b) in enumerate(zip(prompts, real, sim)):
        if a[0] == b[0]:
            cached_ok += 1
        common = a[2] & b[2]
        total = max(sum(a[2].values()), sum(b[2].values()))
        evict_total += total
        evict_ok += sum(common.values())
        if a[1] == b[1]:
            store_ok += 1
        if a[0] != b[0] or a[2] != b[2] or a[1] != b[1]:
            lines.append(f"  #{i}: len {len(p)} max_tokens {d}: cached {a[0]} vs {b[0]}; "
                         f"stored {sum(a[1].values())} vs {sum(b[1].values())}; "
                         f"removed {sum(a[2].values())} vs {sum(b[2].values())} "
                         f"({sum(common.values())} alike)")
    n = len(prompts)
    return {"requests": n, "cached_tokens_equal": cached_ok / n,
            "stored_sets_equal": store_ok / n,
            "evictions": evict_total,
            "evictions_equal": evict_ok / evict_total if evict_total else 1.0,
            "mismatches": lines}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ownerserve", required=True)
    ap.add_argument("--venv", default="/tmp/vllm-venv")
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                    help="the real engine (SGLang: its venv as --venv)")
    ap.add_argument("--blocks", type=int, default=95, help="usable KV blocks of both engines")
    ap.add_argument("--prompts", type=int, default=240)
    ap.add_argument("--seed", type=int, default=63)
    ap.add_argument("--json", help="write the shares here")
    args = ap.parse_args()
    log_dir = tempfile.mkdtemp(prefix="calibrate-cache-")
    pool = engines.Pool(args.blocks)
    prompts = script(args.seed, args.prompts, pool.max_model_len)
    real = (engines.Vllm if args.engine == "vllm" else engines.Sglang)(
        args.venv, engines.model_dir(log_dir), pool, log_dir)
    sim = engines.Sim(args.ownerserve, pool, log_dir, ["--instant"])
    try:
        sim.wait_up(60)
        real.wait_up(900)
        started = time.time()
        real_rows, real_gaps = drive(real, prompts)
        sim_rows, sim_gaps = drive(sim, prompts)
    finally:
        real.stop()
        sim.stop()
    got = compare(prompts, real_rows, sim_rows)
    print(f"L1 cache semantics, {args.engine} against the sim engine: {got['requests']} "
          f"prompts, {args.blocks} blocks of "
          f"{engines.BLOCK}, seed {args.seed} ({time.time() - started:.0f} s; logs {log_dir})")
    print("\n".join(got["mismatches"][:40]))
    if len(got["mismatches"]) > 40:
        print(f"  ... {len(got['mismatches']) - 40} more")
    print(f"cached_tokens equal     {got['cached_tokens_equal']:7.1%}  (bar {BAR:.0%})")
    print(f"stored blocks equal     {got['stored_sets_equal']:7.1%}")
    print(f"evicted blocks alike    {got['evictions_equal']:7.1%} of {got['evictions']} "
          f"(bar {BAR:.0%})")
    if real_gaps or sim_gaps:
        print(f"event sequence gaps: vllm {real_gaps}, sim {sim_gaps} (the comparison is void)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v for k, v in got.items() if k != "mismatches"}, f, indent=1)
    ok = (got["cached_tokens_equal"] >= BAR and got["evictions_equal"] >= BAR
          and not real_gaps and not sim_gaps)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
