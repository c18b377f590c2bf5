"""Issue 63 item 5: does our copy of Dynamo's KV router agree with Dynamo's simulation of
itself?

Replays the shipped Mooncake trace through Dynamo's own offline replay (`ai-dynamo` 1.6.1:
`dynamo.replay.run_trace_replay`, its mocker engines and its real KV router on a virtual
clock, no GPU, etcd or NATS), with the KV router (several runs: Dynamo breaks cost ties at
random and takes no seed) and with round robin, on 2 and 4 workers of 16,384 blocks of 64
tokens; then simulates the same trace with our `dynamo_kv` and `round_robin` on the same
block size and capacity (`ownerserve simulate`, a 2-layer model with a 131K context, so the
fleet is not the bottleneck). Prints each side's prefix hit rate (reused / input tokens) and
its requests per worker, and whether ours is within 10% of Dynamo's.

usage: python3 scripts/calibrate/dynamo.py --ownerserve target/debug/ownerserve
       (installs ai-dynamo-runtime into --venv, /tmp/dynamo-venv by default, once)
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE = os.path.join(ROOT, "eval/traces/mooncake_synthetic_trace.jsonl")
BLOCK, BLOCKS, RUNS = 64, 16384, 5
TOLERANCE = 0.10

# Runs inside the Dynamo venv: one replay, its hit rate and requests per worker as JSON.
REPLAY = r"""
import collections, json, sys
from dynamo._core import KvRouterConfig
from dynamo.replay import run_trace_replay
trace, mode, workers, block, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rep = run_trace_replay(trace, router_mode=mode, num_workers=workers, trace_block_size=512,
    extra_engine_args={"engine": {"backend": "vllm", "block_size": block, "num_gpu_blocks": blocks,
                                  "max_num_seqs": 256, "max_num_batched_tokens": 8192}},
    router_config=KvRouterConfig(), capture_per_request=True)
reqs = rep.per_request
total = sum(r["input_length"] for r in reqs)
reused = sum(r["reused_input_tokens"] or 0 for r in reqs)
per = collections.Counter(r["decode_worker_idx"] for r in reqs)
print(json.dumps({"hit": reused / total, "per_worker": sorted(per.values())}))
"""


def setup(venv):
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [os.path.join(venv, "bin", "pip"), "install", "-q"]
        subprocess.run(pip + ["ai-dynamo-runtime==1.6.1"], check=True)
        # `ai-dynamo`'s own dependency `aisimulate` is a stub that fetches from NVIDIA's
        # index (unreachable here); the replay needs only the runtime and these.
        subprocess.run(pip + ["--no-deps", "ai-dynamo==1.6.1"], check=True)
        subprocess.run(pip + ["typing-extensions", "msgspec", "prometheus-client"], check=True)
    return os.path.join(venv, "bin", "python")


def dynamo(python, mode, workers):
    env = dict(os.environ, DYN_LOG="error")
    out = subprocess.run([python, "-c", REPLAY, TRACE, mode, str(workers), str(BLOCK),
                          str(BLOCKS)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(ownerserve, workers, tmp):
    model = os.path.join(tmp, "tiny-long.toml")
    with open(os.path.join(ROOT, "configs/models/tiny-llama-cpu.toml")) as f:
        text = f.read()
    with open(model, "w") as f:
        f.write(text.replace("max_model_len = 8192", "max_model_len = 131072"))
    stem = os.path.join(tmp, f"ours-{workers}")
    subprocess.run([ownerserve, "simulate", "--workload", "mooncake", "--cluster", f"{workers}h",
                    "--policy", "dynamo_kv,round_robin", "--block-size", str(BLOCK),
                    "--max-kv-blocks", str(BLOCKS), "--model-preset", model, "--quiet",
                    "--summary-json", stem + ".json", "--steps-csv", stem], check=True,
                   stdout=subprocess.DEVNULL)
    got = {}
    for r in json.load(open(stem + ".json")):
        with open(f"{stem}-{r['policy']}.csv") as f:
            rows = list(csv.DictReader(f))
        per = {}
        for row in rows:
            if row["decode_on"]:
                per[row["decode_on"]] = per.get(row["decode_on"], 0) + 1
        got[r["policy"]] = {"hit": r["cached_tokens"] / r["prompt_tokens"],
                            "per_worker": sorted(per.values())}
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ownerserve", required=True)
    ap.add_argument("--venv", default="/tmp/dynamo-venv")
    args = ap.parse_args()
    python = setup(args.venv)
    tmp = tempfile.mkdtemp(prefix="calibrate-dynamo-")
    ok = True
    for workers in (2, 4):
        kv = [dynamo(python, "kv_router", workers) for _ in range(RUNS)]
        rr = dynamo(python, "round_robin", workers)
        mine = ours(args.ownerserve, workers, tmp)
        hits = [r["hit"] for r in kv]
        mean = sum(hits) / len(hits)
        for name, theirs, ours_ in (("KV router", mean, mine["dynamo_kv"]["hit"]),
                                    ("round robin", rr["hit"], mine["round_robin"]["hit"])):
            within = abs(ours_ - theirs) <= TOLERANCE * theirs
            ok &= within
            spread = f" (runs {min(hits):.3f}-{max(hits):.3f})" if name == "KV router" else ""
            print(f"{workers} workers, {name:11s}: hit rate Dynamo {theirs:.3f}{spread}, ours "
                  f"{ours_:.3f} ({ours_ / theirs - 1:+.0%}: "
                  f"{'within' if within else 'outside'} 10%)")
        print(f"{workers} workers, requests per worker: Dynamo KV router {kv[0]['per_worker']}, "
              f"ours {mine['dynamo_kv']['per_worker']}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
