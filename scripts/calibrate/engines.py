"""The engines a calibration compares, started the same way: one real vLLM (CPU, random
weights, the shared recipe) and one `ownerserve sim-worker` with the same KV pool, block
size, step budget and sequence cap; a tap on each engine's KV events; and a canonical name
for every block, so two engines' hashes (vLLM's sha256, the sim's own) compare by content.

Runs under the real engine's venv (it has `zmq` and `msgspec`)."""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import msgspec
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "real_vllm"))
import suite  # noqa: E402  (the real-engine suite's model and tokenizer fixture)

BLOCK = 32  # vLLM's CPU attention needs a multiple of 32.
MODEL = "tiny"
TOPIC = "kv-events"


# The suite's: it never hands out a port twice in one run.
free_port = suite.free_port


def post(url, body, timeout=300):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get_text(url, timeout=60):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def model_dir(log_dir):
    """The suite's tiny Llama (config + the fixture's 4,096-token BPE)."""
    d = os.path.join(log_dir, "model")
    os.makedirs(d, exist_ok=True)
    import shutil
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(suite.TOKENIZER_FIXTURE, f), d)
    suite.write_model_config(d)
    return d


class Pool:
    """What both engines are given: `blocks` usable KV blocks (vLLM adds its null block),
    the step's token budget, the sequence cap and the context length."""

    def __init__(self, blocks, batched_tokens=1024, max_seqs=256, max_model_len=2048):
        self.blocks, self.batched_tokens = blocks, batched_tokens
        self.max_seqs, self.max_model_len = max_seqs, max_model_len


class Process:
    def __init__(self, name, cmd, env, log_dir):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_up(self, deadline_s):
        end = time.time() + deadline_s
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   f"{self.tail()}")
            if healthy(self.url):
                return
            time.sleep(1)
        raise RuntimeError(f"{self.name} not up in {deadline_s} s: {self.tail()}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        self.log.close()

    def tail(self, n=20):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def metric(self, name):
        """Sum of a counter or gauge's samples in `/metrics`."""
        total, seen = 0.0, False
        for line in get_text(self.url + "/metrics").splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.split()[-1])
                seen = True
        if not seen:
            raise KeyError(f"{self.name}: no {name} in /metrics")
        return total


class Vllm(Process):
    def __init__(self, venv, model, pool, log_dir, extra=(), log_level="WARNING", name="vllm",
                 env=None):
        self.port, self.zmq = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1",
                   VLLM_LOGGING_LEVEL=log_level, **(env or {}))
        cmd = ["nice", "-n", "10", f"{venv}/bin/python", "-m",
               "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", MODEL, "--load-format", "dummy", "--dtype", "float32",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", str(pool.max_model_len), "--enforce-eager",
               "--kv-cache-memory-bytes", str(256 << 20),
               # vLLM keeps block 0 as its null block: one more than the sim's usable blocks.
               "--num-gpu-blocks-override", str(pool.blocks + 1),
               "--max-num-batched-tokens", str(pool.batched_tokens),
               "--max-num-seqs", str(pool.max_seqs),
               "--enable-prefix-caching", "--block-size", str(BLOCK),
               "--enable-prompt-tokens-details",
               "--kv-events-config", json.dumps({
                   "enable_kv_cache_events": True, "publisher": "zmq",
                   "endpoint": f"tcp://*:{self.zmq}", "topic": TOPIC}), *extra]
        super().__init__(name, cmd, env, log_dir)


class Sglang(Process):
    """One real SGLang (CPU, the real-engine suite's recipe) with a pool of `pool.blocks`
    pages of `BLOCK` tokens: its radix cache, token-granular, matched by page."""

    def __init__(self, venv, model, pool, log_dir, name="sglang"):
        self.port, self.zmq = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        stub = os.path.join(venv, "stub")
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1",
                   LD_LIBRARY_PATH=stub + (":" + os.environ["LD_LIBRARY_PATH"]
                                           if os.environ.get("LD_LIBRARY_PATH") else ""))
        cmd = ["nice", "-n", "10", f"{venv}/bin/python", "-m", "sglang.launch_server",
               "--model-path", model, "--served-model-name", MODEL, "--device", "cpu",
               "--load-format", "dummy", "--attention-backend", "torch_native",
               "--sleep-on-idle", "--host", "127.0.0.1", "--port", str(self.port),
               "--max-total-tokens", str(pool.blocks * BLOCK), "--page-size", str(BLOCK),
               "--chunked-prefill-size", str(pool.batched_tokens),
               "--max-running-requests", str(pool.max_seqs),
               "--context-length", str(pool.max_model_len), "--enable-cache-report",
               "--kv-events-config", json.dumps({
                   "publisher": "zmq", "endpoint": f"tcp://*:{self.zmq}", "topic": TOPIC})]
        super().__init__(name, cmd, env, log_dir)


class Sim(Process):
    def __init__(self, ownerserve, pool, log_dir, extra=()):
        self.port, self.zmq = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [ownerserve, "sim-worker", "--port", str(self.port),
               "--model-preset", os.path.join(ROOT, "configs/models/tiny-llama-cpu.toml"),
               "--gpu-preset", os.path.join(ROOT, "configs/gpus/cpu-2core.toml"),
               "--served-model-name", MODEL, "--block-size", str(BLOCK),
               "--max-kv-blocks", str(pool.blocks),
               "--max-num-batched-tokens", str(pool.batched_tokens),
               "--max-num-seqs", str(pool.max_seqs),
               "--kv-events-endpoint", f"tcp://127.0.0.1:{self.zmq}",
               "--kv-events-topic", TOPIC, *extra]
        super().__init__("sim", cmd, dict(os.environ), log_dir)


class Tap:
    """Every KV event an engine publishes, in order, each with the time it arrived."""

    def __init__(self, port):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 100)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.events, self.lock, self.running = [], threading.Lock(), True
        self.last_seq = None
        self.gaps = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running:
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            seq = int.from_bytes(frames[-2], "big")
            if self.last_seq is not None and seq != self.last_seq + 1:
                self.gaps += 1
            self.last_seq = seq
            batch = msgspec.msgpack.decode(frames[-1])
            with self.lock:
                for ev in batch[1]:
                    self.events.append((time.time(), ev))

    def count(self):
        with self.lock:
            return len(self.events)

    def since(self, mark):
        with self.lock:
            return [ev for _, ev in self.events[mark:]]

    def quiet(self, quiet_s=0.3, deadline_s=10.0):
        """Waits until no event arrived for `quiet_s` since this call; returns the count
        then."""
        start = time.time()
        end = start + deadline_s
        while time.time() < end:
            with self.lock:
                last = max(self.events[-1][0] if self.events else 0.0, start)
                n = len(self.events)
            if time.time() - last >= quiet_s:
                return n
            time.sleep(0.05)
        return self.count()

    def close(self):
        self.running = False
        self.thread.join(timeout=2)
        self.sock.close(0)


def field(ev, name, pos):
    """An event field from a tagged map or a legacy positional array."""
    return ev.get(name) if isinstance(ev, dict) else ev[pos]


def kind(ev):
    return ev.get("type") if isinstance(ev, dict) else ev[0]


class Canon:
    """Engine hash -> a name for the block's content: its chain of prompt tokens. A block
    holding generated tokens (which differ between a random-weight model and the sim) is
    named by its parent and the mark "gen", so both engines name it alike."""

    def __init__(self, prompt_keys):
        self.prompt_keys = prompt_keys
        self.names = {}

    def stored(self, ev):
        hashes = field(ev, "block_hashes", 1)
        parent = field(ev, "parent_block_hash", 2)
        tokens = field(ev, "token_ids", 3)
        size = field(ev, "block_size", 4) or BLOCK
        names = []
        prev = self.names.get(parent, "?") if parent is not None else ""
        for i, h in enumerate(hashes):
            chunk = tokens[i * size:(i + 1) * size]
            name = chain_key(prev, chunk)
            if name not in self.prompt_keys:
                name = chain_key(prev, "gen")
            self.names[h] = name
            names.append(name)
            prev = name
        return names

    def removed(self, ev):
        return [self.names.get(h, f"unknown:{h}") for h in field(ev, "block_hashes", 1)]


def chain_key(parent, chunk):
    return hashlib.blake2b(f"{parent}|{chunk}".encode(), digest_size=12).hexdigest()


def prompt_chain_keys(prompts):
    """The names of every full block of every prompt."""
    keys = set()
    for p in prompts:
        prev = ""
        for i in range(len(p) // BLOCK):
            prev = chain_key(prev, list(p[i * BLOCK:(i + 1) * BLOCK]))
            keys.add(prev)
    return keys
