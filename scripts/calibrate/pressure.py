"""L2 of issue 63: scheduling under KV pressure, the simulator against a real engine.

Both engines (`engines.Vllm`, `engines.Sim`, the same 95-block pool and step budget) get one
batch of long generations at once (one streamed completions request with a prompt per
choice, so both see the same arrival order): more than the pool holds, so sequences are
preempted and resumed. Compares the preemptions (`vllm:num_preemptions_total`), the order in
which the choices' first tokens arrive (pairwise agreement), and the tokens per engine step
(`vllm:iteration_tokens_total`, bucket by bucket). Exits 1 below the issue's bars
(preemptions within 10%, first-token order agreement 90%).

usage: /tmp/vllm-venv/bin/python scripts/calibrate/pressure.py --ownerserve target/debug/ownerserve
"""

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request

import engines

PREEMPTION_TOLERANCE = 0.10
ORDER_BAR = 0.90


def batch(seed, n):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, 4096) for _ in range(rng.randrange(64, 600))]
               for _ in range(n)]
    return prompts, rng.randrange(300, 500)


def first_token_order(url, prompts, max_tokens):
    """Streams one batch; returns the choice indices in the order their first chunk came."""
    body = {"model": engines.MODEL, "prompt": prompts, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    order, seen = [], set()
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                if c["index"] not in seen:
                    seen.add(c["index"])
                    order.append(c["index"])
    return order


def histogram(engine, name):
    """Bucket counts (not cumulative) of a histogram in `/metrics`, by upper bound."""
    cumulative = {}
    for line in engines.get_text(engine.url + "/metrics").splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            cumulative[float(le)] = float(line.split()[-1])
    out, prev = {}, 0.0
    for le in sorted(cumulative):
        out[le] = cumulative[le] - prev
        prev = cumulative[le]
    return out


def measure(engine, prompts, max_tokens):
    pre = engine.metric("vllm:num_preemptions_total")
    h0 = histogram(engine, "vllm:iteration_tokens_total")
    order = first_token_order(engine.url, prompts, max_tokens)
    time.sleep(1.0)  # vLLM's metrics trail the last chunk
    h1 = histogram(engine, "vllm:iteration_tokens_total")
    steps = {le: h1[le] - h0.get(le, 0.0) for le in h1}
    return {"preemptions": engine.metric("vllm:num_preemptions_total") - pre,
            "order": order, "steps": steps}


def pairwise_agreement(a, b):
    pa = {c: i for i, c in enumerate(a)}
    pb = {c: i for i, c in enumerate(b)}
    keys = sorted(set(pa) & set(pb))
    pairs = [(x, y) for i, x in enumerate(keys) for y in keys[i + 1:]]
    same = sum((pa[x] < pa[y]) == (pb[x] < pb[y]) for x, y in pairs)
    return same / len(pairs) if pairs else 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ownerserve", required=True)
    ap.add_argument("--venv", default="/tmp/vllm-venv")
    ap.add_argument("--blocks", type=int, default=95)
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--batched-tokens", type=int, default=512)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--json")
    args = ap.parse_args()
    log_dir = tempfile.mkdtemp(prefix="calibrate-pressure-")
    pool = engines.Pool(args.blocks, batched_tokens=args.batched_tokens)
    real = engines.Vllm(args.venv, engines.model_dir(log_dir), pool, log_dir)
    sim = engines.Sim(args.ownerserve, pool, log_dir, ["--instant"])
    rows = []
    try:
        sim.wait_up(60)
        real.wait_up(900)
        for seed in (int(s) for s in args.seeds.split(",")):
            prompts, max_tokens = batch(seed, args.sequences)
            a = measure(real, prompts, max_tokens)
            b = measure(sim, prompts, max_tokens)
            rows.append((seed, max_tokens, a, b))
    finally:
        real.stop()
        sim.stop()
    print(f"L2 scheduling under pressure: {args.sequences} sequences into {args.blocks} blocks "
          f"of {engines.BLOCK}, step budget {args.batched_tokens} (logs {log_dir})")
    ok, report = True, []
    for seed, max_tokens, a, b in rows:
        agree = pairwise_agreement(a["order"], b["order"])
        p_real, p_sim = a["preemptions"], b["preemptions"]
        within = abs(p_sim - p_real) <= PREEMPTION_TOLERANCE * max(p_real, 1)
        ok &= within and agree >= ORDER_BAR
        print(f"seed {seed} (max_tokens {max_tokens}): preemptions vllm {p_real:.0f} sim "
              f"{p_sim:.0f} ({'within' if within else 'outside'} 10%); first-token order "
              f"agreement {agree:.1%}")
        print(f"  first tokens: vllm {a['order']}\n                sim  {b['order']}")
        bounds = sorted(set(a["steps"]) | set(b["steps"]))
        print("  steps by tokens/step: " + ", ".join(
            f"<={le:g}: {a['steps'].get(le, 0):.0f}/{b['steps'].get(le, 0):.0f}"
            for le in bounds if a["steps"].get(le) or b["steps"].get(le)) + "  (vllm/sim)")
        report.append({"seed": seed, "preemptions": [p_real, p_sim], "order_agreement": agree,
                       "steps": {"vllm": a["steps"], "sim": b["steps"]}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
