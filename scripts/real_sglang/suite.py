#!/usr/bin/env python3
"""The real-SGLang suite: `ownerserve router` in front of two real SGLang CPU engines.

Run by `scripts/test` (so by `.ci/run`) after the real-vLLM suite, never beside it (memory
and the 2 cores would not suffice for both). `setup.sh` beside this file installs the engine
(cached); the model is the tiny random-weight Llama the vLLM suite uses (its tokenizer is the
committed fixture `workers-shim/tests/fixtures/tokenizers/local`, whose chat template SGLang
applies). The two engines start once, in parallel (page size 16, KV events with replay,
metrics and cache reports on), and every router in front of them runs with DEFAULT health
settings: no `health_*` key is set. Checks, in order:

1. The official `openai` SDK: chat and completions, stream and not, usage, and a repeated
   prompt's `usage.prompt_tokens_details.cached_tokens > 0`.
2. Capacity: `/admin/v1/workers` shows each engine's `sglang:max_total_num_tokens` as its
   `kv_capacity_tokens` (source `engine`).
3. Prefix routing with token-id prompts and with chat prompts (the model's own tokenizer
   and template): repeats with a new suffix land on the holder (>= 95 %) with
   `cached_tokens > 0`.
4. KV events: 0 malformed and 0 rejected, the block size (16) learned from the engines, and
   a fresh router's index, rebuilt from the engines' replay alone, has the live digest.
5. Health: over >= 2 minutes (idle, then mixed idle and traffic) no worker is marked down
   while alive and no request fails.
6. `kill -9` of an engine mid-stream: the client gets an SSE error event and `[DONE]`, later
   requests go to the survivor, and the dead engine's blocks leave the index.
7. `POST /flush_cache` on the survivor (SGLang's `AllBlocksCleared`): its blocks leave the
   index.
8. The parked sessions' KV lifecycle: the real-vLLM suite's step 5 (its `LIFECYCLE_DOC`,
   the same checks and thresholds) on a third engine of its own, started once the others
   stopped: a 49,152-token pool, `--enable-priority-scheduling --default-priority-value 0`
   and `SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES=1` (the router marks a returning step
   `x-override-priority: 1`, which SGLang reads only with it), `--max-running-requests 2`.
   The lever is the one vLLM gets: touches keep a kept session ahead of the radix cache's
   LRU. SGLang 0.5.23's `--radix-eviction-policy priority` is not used: a node's priority
   is the max of every request's that ever touched it and is never lowered
   (`mem_cache/radix_cache.py`, `_insert_helper`), so a session let go or closed would stay
   pinned ahead of every unmarked prompt. Its session radix cache
   (`--enable-session-radix-cache`, `session_params` on a request, `/close_session`), which
   would hold a session until closed, is not driven yet.

Prints every measured figure and `PASS`/`FAIL` per check; exits 1 if any check failed.

Usage: python3 scripts/real_sglang/suite.py --ownerserve target/debug/ownerserve --venv VENV
       [--only lifecycle]
"""
import argparse
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

import openai

HERE = os.path.dirname(os.path.abspath(__file__))


def _vllm_suite():
    """The real-vLLM suite's module, for the helpers the two suites share (requests, waits,
    prompts, the tiny model)."""
    spec = importlib.util.spec_from_file_location(
        "real_vllm_suite", os.path.join(os.path.dirname(HERE), "real_vllm", "suite.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _vllm_suite()
TOKENIZER_FIXTURE, conversation, error_event, free_port, http, ok_status, settle, \
    sse_payloads, wait_for, write_model_config = (
        _shared.TOKENIZER_FIXTURE, _shared.conversation, _shared.error_event, _shared.free_port,
        _shared.http, _shared.ok_status, _shared.settle, _shared.sse_payloads, _shared.wait_for,
        _shared.write_model_config)

TOKEN = "real-sglang-suite"
MODEL = "tiny"
PAGE = 16
MAX_TOTAL_TOKENS = 16384
# Not the planner's default (8192 for its H100 preset): the router must read it from the
# engines' /server_info for the planner to price prefills in it.
CHUNKED_PREFILL = 4096
ROUTING_BAR = 0.95
# Step 8's engine: a pool of 49,152 tokens, as the vLLM suite's lifecycle engine has.
LIFECYCLE_TOKENS = 49152
LIFECYCLE_FLOOD_PER_S = 4
# The acceptance: >= 2 minutes of idle and traffic, >= 60 s of it mixed.
IDLE_S, MIXED_S = 60, 70


class Engine:
    """One real SGLang engine (server, scheduler and detokenizer processes) and its ports."""

    def __init__(self, name, venv, model_dir, log_dir, max_total_tokens=MAX_TOTAL_TOKENS,
                 extra=()):
        self.name = name
        self.port, self.zmq, self.replay = (free_port() for _ in range(3))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(log_dir, f"{name}.log")
        stub = os.path.join(venv, "stub")
        # SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES: without it SGLang ignores the
        # `x-override-priority` the router marks a returning step with (step 8).
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1",
                   SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES="1",
                   LD_LIBRARY_PATH=stub + (":" + os.environ["LD_LIBRARY_PATH"]
                                           if os.environ.get("LD_LIBRARY_PATH") else ""))
        cmd = [f"{venv}/bin/python", "-m", "sglang.launch_server",
               "--model-path", model_dir, "--served-model-name", MODEL,
               "--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
               # Without it each idle engine busy-polls a core at 100 %.
               "--sleep-on-idle",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--max-total-tokens", str(max_total_tokens), "--page-size", str(PAGE),
               "--chunked-prefill-size", str(CHUNKED_PREFILL),
               "--enable-metrics", "--enable-cache-report",
               "--kv-events-config", json.dumps({
                   "publisher": "zmq", "endpoint": f"tcp://*:{self.zmq}", "topic": "kv-events",
                   "replay_endpoint": f"tcp://*:{self.replay}"}), *extra]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def worker_toml(self):
        return (f'[[workers]]\nname = "{self.name}"\nurl = "{self.url}"\nrole = "hybrid"\n'
                f'engine = "sglang"\nkv_events = "tcp://127.0.0.1:{self.zmq}"\n'
                f'kv_replay = "tcp://127.0.0.1:{self.replay}"\n')

    def ready(self):
        return (http("GET", self.url + "/ready", timeout=5)[0] == 200
                and http("GET", self.url + "/v1/models", timeout=5)[0] == 200)

    def metric(self, name):
        _, _, text = http("GET", self.url + "/metrics", timeout=60)
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{self.name}: no {name} in /metrics")

    def alive(self):
        return self.proc.poll() is None

    def kill9(self):
        """Kills the engine's whole process group: a kill -9 of the server alone leaves its
        scheduler and detokenizer running for a while."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        # Its children can outlive the server by a few seconds.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()

    def tail(self, n=30):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])


class Router:
    """One `ownerserve router` in front of the engines, with default health settings."""

    def __init__(self, ownerserve, log_dir, label, workers, extra=""):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = os.path.join(log_dir, f"router-{label}.toml")
        with open(self.config, "w") as f:
            # No health_* key (the defaults are what is tested) and no kv_block_size (the
            # router learns the engines' page size from /server_info).
            f.write(f'[router]\nport = {self.port}\npolicy = "kv_aware"\n'
                    f'admin_token = "{TOKEN}"\n\n'
                    f'[router.tokenizers]\n"{MODEL}" = "{TOKENIZER_FIXTURE}"\n\n{extra}\n'
                    f'{workers}')
        self.log_path = os.path.join(log_dir, f"router-{label}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([ownerserve, "router", "--config", self.config],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(f"router {label} /health", ok_status(self.url + "/health"), 60, 0.2)
        n = workers.count("[[workers]]")
        wait_for(f"router {label}: {n} healthy workers",
                 lambda: self.healthy() == n, 30, 0.2)

    def healthy(self):
        return http("GET", self.url + "/health", timeout=10)[2].get("healthy_workers")

    def post(self, path, body, headers=None):
        return http("POST", self.url + path, body, headers)

    def admin(self, path):
        return http("GET", self.url + path, headers={"authorization": f"Bearer {TOKEN}"})[2]

    def kv(self):
        return self.admin("/admin/v1/kv")

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def cached_tokens(resp):
    return ((resp.get("usage") or {}).get("prompt_tokens_details") or {}).get(
        "cached_tokens") or 0


class Suite:
    def __init__(self, args):
        self.args = args
        self.results = []
        self.log_dir = tempfile.mkdtemp(prefix="ownerserve-real-sglang-")
        self.routers = []

    def check(self, name, cond, detail):
        self.results.append((name, bool(cond), detail))
        print(f"{'PASS' if cond else 'FAIL'}  {name}: {detail}", flush=True)

    def router(self, label, engines, extra=""):
        r = Router(self.args.ownerserve, self.log_dir, label,
                   "".join(e.worker_toml() for e in engines), extra)
        self.routers.append(r)
        return r

    def step_budget(self, r, engines):
        """The planner prices prefills in each engine's own chunked-prefill size, which the
        router reads from its /server_info (no worker key sets it here)."""
        reported = [http("GET", e.url + "/server_info", timeout=30)[2].get("chunked_prefill_size")
                    for e in engines]
        _, _, plan = r.post("/admin/v1/plan/explain", {
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            {"authorization": f"Bearer {TOKEN}"})
        priced = [w.get("max_num_batched_tokens") for w in plan.get("workers", [])]
        self.check("step budget: the planner's is each engine's chunked_prefill_size",
                   reported == [CHUNKED_PREFILL] * len(engines)
                   and priced == [CHUNKED_PREFILL] * len(engines),
                   f"engines report {reported}, the planner prices {priced}")

    # --- 1. the official SDK ---------------------------------------------------------

    def openai_sdk(self, r, engines):
        names = [e.name for e in engines]
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Say something about routers."}]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, max_tokens=8, extra_body={"ignore_eos": True})
        chat = raw.parse()
        self.check("sdk: chat", chat.choices[0].message.content is not None
                   and chat.usage.completion_tokens == 8 and chat.usage.prompt_tokens > 0
                   and raw.headers.get("x-ownerserve-worker") in names,
                   f"usage {chat.usage.prompt_tokens}+{chat.usage.completion_tokens}, "
                   f"worker {raw.headers.get('x-ownerserve-worker')}")
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=8, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        deltas = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        usage = chunks[-1].usage if chunks else None
        self.check("sdk: chat stream with usage", deltas >= 1 and usage is not None
                   and usage.completion_tokens == 8,
                   f"{len(chunks)} chunks, {deltas} with content, last usage {usage}")
        comp = client.completions.create(model=MODEL, prompt="def route(request):", max_tokens=6,
                                         extra_body={"ignore_eos": True})
        self.check("sdk: completions", comp.usage.completion_tokens == 6
                   and isinstance(comp.choices[0].text, str), f"usage {comp.usage}")
        chunks = list(client.completions.create(
            model=MODEL, prompt="def route(request):", max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        usage = chunks[-1].usage if chunks else None
        self.check("sdk: completions stream with usage", usage is not None
                   and usage.completion_tokens == 6, f"{len(chunks)} chunks, last usage {usage}")
        # A long prompt twice: the second reports the cached prefix, streamed or not.
        long_msgs = conversation(random.Random(1), 200)
        client.chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=2)
        again = client.chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=2)
        details = again.usage.prompt_tokens_details
        got = details.cached_tokens if details else None
        self.check("sdk: usage.prompt_tokens_details.cached_tokens on a repeat",
                   got is not None and got > 0,
                   f"{got} of {again.usage.prompt_tokens} prompt tokens cached")
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=long_msgs, max_tokens=2, stream=True,
            stream_options={"include_usage": True}))
        usage = chunks[-1].usage if chunks else None
        got = (usage.prompt_tokens_details.cached_tokens
               if usage is not None and usage.prompt_tokens_details else None)
        self.check("sdk: streamed usage with cached_tokens on a repeat",
                   got is not None and got > 0, f"last usage {usage}")
        try:
            client.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=4)
            self.check("sdk: error for an unknown model", False, "the request succeeded")
        except openai.APIStatusError as e:
            self.check("sdk: error for an unknown model", isinstance(e, openai.NotFoundError),
                       f"{e.status_code} {type(e).__name__}")

    # --- 2. capacity ------------------------------------------------------------------------

    def capacity(self, r, engines):
        rows = {w["id"]: w for w in r.admin("/admin/v1/workers")["workers"]}
        for e in engines:
            reported = e.metric("sglang:max_total_num_tokens")
            row = rows.get(e.name, {})
            self.check(f"capacity: /admin/v1/workers shows {e.name}'s as the engine reports it",
                       row.get("kv_capacity_tokens") == int(reported)
                       and row.get("kv_capacity_source") == "engine",
                       f"engine sglang:max_total_num_tokens {reported:.0f}, router "
                       f"{row.get('kv_capacity_tokens')} ({row.get('kv_capacity_source')})")

    # --- 3. prefix routing ------------------------------------------------------------------

    def routing(self, r, label, firsts, repeat_of, path):
        """Sends each first body, lets the index settle, then a repeat of each twice (a new
        suffix each time); checks the repeats' share on the first's worker."""
        holders = []
        for body in firsts:
            status, h, resp = r.post(path, body)
            assert status == 200, f"first send: {status} {resp}"
            holders.append(h.get("x-ownerserve-worker"))
        settle(r)
        on_holder = cached = total = 0
        for k, (body, holder) in enumerate(zip(firsts, holders)):
            for rep in range(2):
                status, h, resp = r.post(path, repeat_of(body, k * 2 + rep))
                assert status == 200, f"repeat: {status} {resp}"
                total += 1
                on_holder += h.get("x-ownerserve-worker") == holder
                cached += cached_tokens(resp) > 0
        bar = ROUTING_BAR * total
        spread = {n: holders.count(n) for n in set(holders)}
        self.check(f"{label} routing: repeats on the holder", on_holder >= bar,
                   f"{on_holder}/{total} (first sends per worker {spread})")
        self.check(f"{label} routing: cached_tokens > 0", cached >= bar, f"{cached}/{total}")

    def token_routing(self, r):
        rng = random.Random(7)
        firsts = [{"model": MODEL, "prompt": [rng.randrange(10, 4000) for _ in range(400)],
                   "max_tokens": 2} for _ in range(10)]

        def repeat(body, k):
            return dict(body, prompt=body["prompt"] + [rng.randrange(10, 4000) for _ in range(8)])
        self.routing(r, "token-id", firsts, repeat, "/v1/completions")

    def chat_routing(self, r):
        rng = random.Random(3)
        firsts = [{"model": MODEL, "messages": conversation(rng, 350), "max_tokens": 2}
                  for _ in range(10)]

        def repeat(body, k):
            msgs = [dict(m) for m in body["messages"]]
            msgs[-1]["content"] += f" and then step {k} {rng.random():.6f}"
            return dict(body, messages=msgs)
        self.routing(r, "chat (model tokenizer)", firsts, repeat, "/v1/chat/completions")

    # --- 4. KV events -----------------------------------------------------------------------

    def kv_events(self, r, engines):
        kv = r.kv()
        malformed = {w["id"]: (w.get("events") or {}).get("malformed") for w in kv["workers"]}
        received = {w["id"]: (w.get("events") or {}).get("events") for w in kv["workers"]}
        self.check("kv block size learned from the engines (SGLang page_size)",
                   kv["block_size"] == PAGE,
                   f"router hashes {kv['block_size']}-token blocks, engines use {PAGE}")
        self.check("kv events: 0 malformed and 0 rejected from real SGLang engines",
                   all(m == 0 for m in malformed.values()) and kv["blocks"] > 0
                   and kv["stats"]["events_rejected"] == 0,
                   f"malformed {malformed}, events {received}, {kv['blocks']} blocks, "
                   f"rejected {kv['stats']['events_rejected']}")
        fresh = self.router("replayed", engines)
        try:
            same = wait_for("the replayed index's digest", lambda: (
                d if (d := fresh.kv()["digest"]) == r.kv()["digest"] else None), 30, 0.5)
            self.check("kv events: a restarted router's index, from the engines' replay, has "
                       "the live index's digest", True,
                       f"{same} ({fresh.kv()['blocks']} blocks, replayed batches "
                       f"{[(w.get('events') or {}).get('replayed_batches') for w in fresh.kv()['workers']]})")
        except AssertionError as e:
            per_worker = lambda kv: {w["id"]: (w["blocks"], w["digest"]) for w in kv["workers"]}
            self.check("kv events: a restarted router's index, from the engines' replay, has "
                       "the live index's digest", False,
                       f"{e}; live {per_worker(r.kv())}, replayed {per_worker(fresh.kv())}")
        finally:
            fresh.stop()

    # --- 5. health with default settings ----------------------------------------------------

    def health_soak(self, r, engines):
        """IDLE_S of idle, then MIXED_S of traffic in bursts with idle gaps; the router's
        healthy count is watched every 0.25 s throughout."""
        n = len(engines)
        seen, stop = [], threading.Event()

        def watch():
            while not stop.is_set():
                seen.append(r.healthy())
                time.sleep(0.25)
        watcher = threading.Thread(target=watch)
        watcher.start()
        rng = random.Random(13)
        statuses = []
        bad = []
        started = time.time()
        try:
            time.sleep(IDLE_S)
            mixed_end = time.time() + MIXED_S
            while time.time() < mixed_end:
                # A burst of 1-4 requests (chat and completions, some streamed), then idle.
                for _ in range(rng.randint(1, 4)):
                    stream = rng.random() < 0.5
                    if rng.random() < 0.5:
                        body = {"model": MODEL, "messages": conversation(rng, 60),
                                "max_tokens": 16, "stream": stream}
                        path = "/v1/chat/completions"
                    else:
                        body = {"model": MODEL, "prompt": [rng.randrange(10, 4000)
                                                           for _ in range(200)],
                                "max_tokens": 16, "stream": stream}
                        path = "/v1/completions"
                    status, _, resp = r.post(path, body)
                    ok = status == 200 and (not stream or (
                        isinstance(resp, str) and "[DONE]" in resp
                        and error_event(sse_payloads(resp)) is None))
                    statuses.append(status if ok else f"{status}!")
                    if not ok and len(bad) < 3:
                        # What the client got, so a failure says why: its error event if
                        # it has one, else its end.
                        text = str(resp)
                        err = error_event(sse_payloads(text)) if isinstance(resp, str) else None
                        part = err if err is not None else text[-200:]
                        bad.append(f"{path} stream={stream} ({len(text)} chars): {part!r}")
                time.sleep(rng.uniform(0.0, 3.0))
        finally:
            stop.set()
            watcher.join()
        took = time.time() - started
        failed = [s for s in statuses if s != 200]
        downs = r.log_text().count("worker is down")
        self.check("health (default settings): no worker marked down while alive",
                   all(e.alive() for e in engines) and min(seen, default=0) == n and downs == 0,
                   f"{took:.0f} s ({IDLE_S} s idle, {MIXED_S} s mixed): healthy workers "
                   f"min {min(seen, default=None)} over {len(seen)} looks, 'worker is down' "
                   f"logged {downs} times")
        self.check("health (default settings): 0 failed requests over mixed idle and traffic",
                   statuses and not failed,
                   f"{len(statuses) - len(failed)}/{len(statuses)} ok, failed {failed[:10]} {bad}")

    # --- 6. kill -9 mid-stream ------------------------------------------------------------------

    def kill_mid_stream(self, r, engines):
        body = json.dumps({"model": MODEL, "messages": conversation(random.Random(9), 100),
                           "max_tokens": 3000, "stream": True, "ignore_eos": True}).encode()
        req = urllib.request.Request(r.url + "/v1/chat/completions", data=body, method="POST",
                                     headers={"content-type": "application/json"})
        resp = urllib.request.urlopen(req, timeout=120)
        name = resp.headers.get("x-ownerserve-worker")
        victim = next(e for e in engines if e.name == name)
        events, killed_at = [], None
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            events.append(line[5:].strip())
            if len(events) == 5:
                victim.kill9()
                killed_at = time.time()
        ended = time.time()
        err = error_event(events)
        self.check("kill -9 mid-stream: SSE error event then [DONE]",
                   killed_at is not None and err is not None and events[-1] == "[DONE]",
                   f"{len(events)} events from {name}, stream ended "
                   f"{ended - (killed_at or ended):.2f} s after the kill, last {events[-2:]}")
        survivor = next(e for e in engines if e is not victim)
        served = []
        for k in range(5):
            status, h, _ = r.post("/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": f"after {k}"}],
                "max_tokens": 2})
            served.append(f"{status} {h.get('x-ownerserve-worker')}")
        self.check("kill -9 mid-stream: later requests served by the survivor",
                   all(s == f"200 {survivor.name}" for s in served), f"{served}")
        blocks = lambda: next(w["blocks"] for w in r.kv()["workers"] if w["id"] == name)
        try:
            wait_for(f"{name}'s blocks leave the index", lambda: blocks() == 0, 15, 0.2)
            self.check("kill -9: the dead engine's blocks left the index", True,
                       f"{name}: 0 blocks {time.time() - (killed_at or 0):.1f} s after the kill")
        except AssertionError as e:
            self.check("kill -9: the dead engine's blocks left the index", False, str(e))
        return survivor

    # --- 7. AllBlocksCleared ------------------------------------------------------------------

    def flush_cache(self, r, engine):
        blocks = lambda: next(w["blocks"] for w in r.kv()["workers"] if w["id"] == engine.name)
        before = blocks()
        status, _, _ = http("POST", engine.url + "/flush_cache")
        try:
            wait_for(f"{engine.name}'s blocks leave the index", lambda: blocks() == 0, 15, 0.2)
            ok = before > 0 and status == 200
        except AssertionError:
            ok = False
        self.check("POST /flush_cache (AllBlocksCleared): the engine's blocks leave the index",
                   ok, f"{engine.name}: {before} blocks before, {blocks()} after (flush {status})")

    # --- the run ---------------------------------------------------------------------------

    def run(self):
        model_dir = os.path.join(self.log_dir, "model")
        os.makedirs(model_dir)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOKENIZER_FIXTURE, f), model_dir)
        write_model_config(model_dir)
        started = time.time()
        n = 0 if self.args.only == "lifecycle" else 2
        engines = [Engine(f"sglang-{i}", self.args.venv, model_dir, self.log_dir)
                   for i in range(n)]
        try:
            for e in engines:
                wait_for(f"engine {e.name}", e.ready, 900, 2)
            if n:
                print(f"{n} real SGLang engines up in {time.time() - started:.0f} s "
                      f"(logs in {self.log_dir})", flush=True)
                self.steps(engines)
        except Exception:
            traceback.print_exc()
            self.check("suite ran to the end", False, "an exception stopped it (above)")
            for e in engines:
                print(f"--- {e.name} log tail\n{e.tail()}")
        finally:
            for r in self.routers:
                r.stop()
            for e in engines:
                e.stop()
            self.routers = []
        self.lifecycle_suite(model_dir)
        failed = [n for n, ok, _ in self.results if not ok]
        print(f"\nreal-SGLang suite: {len(self.results) - len(failed)}/{len(self.results)} "
              f"checks passed in {time.time() - started:.0f} s")
        if failed:
            print("router logs:", self.log_dir)
            for r in self.routers:
                print(f"--- {r.log_path}\n" + open(r.log_path, errors="replace").read()[-3000:])
        return 1 if failed else 0

    def lifecycle_suite(self, model_dir):
        """Step 8: the real-vLLM suite's lifecycle checks (its `LifecycleChecks`) on an
        engine of its own, started after the others stopped."""
        e = Engine("sglang-lc", self.args.venv, model_dir, self.log_dir,
                   max_total_tokens=LIFECYCLE_TOKENS,
                   extra=("--enable-priority-scheduling", "--default-priority-value", "0",
                          "--max-running-requests", "2", "--context-length", "16384"))
        try:
            wait_for(f"engine {e.name}", e.ready, 900, 2)

            def make_router(label, lifecycle, priority):
                return self.router(label, [e], _shared.lifecycle_settings(lifecycle, priority))
            _shared.LifecycleChecks(self.check, TOKEN, make_router,
                                    flood_per_s=LIFECYCLE_FLOOD_PER_S).run()
        except Exception:
            traceback.print_exc()
            self.check("lifecycle step ran to the end", False, "an exception stopped it (above)")
            print(f"--- {e.name} log tail\n{e.tail()}")
        finally:
            for r in self.routers:
                r.stop()
            self.routers = []
            e.stop()

    def steps(self, engines):
        r = self.router("main", engines)
        self.openai_sdk(r, engines)
        self.step_budget(r, engines)
        self.capacity(r, engines)
        self.token_routing(r)
        self.chat_routing(r)
        self.kv_events(r, engines)
        self.health_soak(r, engines)
        survivor = self.kill_mid_stream(r, engines)
        self.flush_cache(r, survivor)


def main():
    # A stopped suite stops its engines: SIGTERM and SIGHUP unwind through `run`'s
    # `finally` (each engine runs in its own process group, killed there). Left running,
    # CPU engines kept both cores busy for 40 minutes after a suite was killed. SIGKILL
    # cannot be caught: kill the engines by hand then.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser()
    ap.add_argument("--ownerserve", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--only", choices=["lifecycle"],
                    help="run only this step (to reproduce one failure)")
    return Suite(ap.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
