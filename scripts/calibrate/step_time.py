"""L3 of issue 63: which step-time form explains a real engine, max or additive.

Runs one real vLLM (CPU) with `--enable-logging-iteration-details`, which logs every engine
step's prefill ("context") tokens, decoding requests and elapsed milliseconds, over a grid:
pure prefill steps (new tokens x cached context), pure decode steps (batch x context) and
mixed steps (a prefill arriving while a batch decodes). Fits the prefill part on the pure
prefill steps (fixed cost + per token + per attention pair) and the decode part on the pure
decode steps (fixed cost + per sequence + per context token read), then predicts every mixed
step both ways: `max(prefill, decode)` (the simulator's default, `Roofline::step_time`) and
`prefill + decode - fixed cost` (`--additive-steps`). Prints each form's error.

These are CPU seconds: they say how this engine composes a mixed step, not what an H100 takes.
The answer frames the simulator's sensitivity runs (docs/EVALUATION.md, fidelity).

usage: /tmp/vllm-venv/bin/python scripts/calibrate/step_time.py
"""

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import engines

LINE = re.compile(r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, "
                  r"(\d+) generation requests, (\d+) generation tokens, "
                  r"iteration elapsed time: ([\d.]+) ms")


class Log:
    """The engine's iteration lines, read from its log file from an offset on."""

    def __init__(self, path):
        self.path, self.offset = path, 0

    def mark(self):
        self.offset = self._size()

    def _size(self):
        with open(self.path, "rb") as f:
            return f.seek(0, 2)

    def since_mark(self, settle_s=1.0):
        time.sleep(settle_s)  # the API server logs a step after its outputs
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
        self.mark()
        return [tuple(float(x) for x in m.groups()) for m in LINE.finditer(text)]


def complete(url, prompt, max_tokens):
    return engines.post(url + "/v1/completions", {
        "model": engines.MODEL, "prompt": prompt, "max_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0})


def pure_prefill(url, log, rng, reps):
    rows = []
    for ctx in (0, 512, 1536):
        for n in (32, 128, 512, 1024, 2048):
            for _ in range(reps):
                prefix = [rng.randrange(4, 4096) for _ in range(ctx)]
                if ctx:
                    complete(url, prefix, 1)
                log.mark()
                complete(url, prefix + [rng.randrange(4, 4096) for _ in range(n)], 1)
                steps = [s for s in log.since_mark(0.3) if s[0] == 1 and s[2] == 0]
                # The engine computes at least the last token: a cached prefix ends a block
                # early at worst.
                rows += [(s[1], ctx + n - s[1], s[4]) for s in steps]
    return rows


def pure_decode(url, log, rng):
    rows = []
    for ctx in (128, 1024, 3000):
        for d in (1, 2, 4, 8, 16):
            log.mark()
            prompts = [[rng.randrange(4, 4096) for _ in range(ctx)] for _ in range(d)]
            complete(url, prompts, 48)
            rows += [(s[2], ctx + 24, s[4]) for s in log.since_mark() if s[0] == 0 and s[2] == d]
    return rows


def mixed(url, log, rng, reps):
    rows = []
    for ctx in (1024, 2800):
        for d in (8, 16):
            for n in (64, 256, 1024):
                log.mark()
                prompts = [[rng.randrange(4, 4096) for _ in range(ctx)] for _ in range(d)]
                t = threading.Thread(target=complete, args=(url, prompts, 1000))
                t.start()
                time.sleep(1.0)
                for _ in range(reps):
                    complete(url, [rng.randrange(4, 4096) for _ in range(n)], 1)
                t.join()
                rows += [(n, d, ctx + 300, s[4]) for s in log.since_mark()
                         if s[0] == 1 and s[1] == n and s[2] == d]
    return rows


def fit(x, y):
    coef, *_ = np.linalg.lstsq(np.array(x, float), np.array(y, float), rcond=None)
    return coef


def joint_fits(prefill, decode, mix):
    """Each form fitted on all steps at once (prefill, decode and mixed); the median error
    of each on the mixed steps. The max form is fitted piecewise: each mixed step counts
    toward the part that dominates it under the current fit, until the split settles."""
    rows = ([(n, c, 0, 0, t) for n, c, t in prefill] + [(0, 0, d, c, t) for d, c, t in decode]
            + [(n, 0, d, c, t) for n, d, c, t in mix])
    mixed = len(prefill) + len(decode)

    def parts(n, pc, d, dc):
        return (n, n * (pc + n / 2)), (d, d * dc)

    add = fit([(1, *parts(*r[:4])[0], *parts(*r[:4])[1]) for r in rows], [r[4] for r in rows])
    coef, split = add, None
    for _ in range(20):
        pre, dec = [], []
        for n, pc, d, dc, _ in rows:
            (x1, x2), (y1, y2) = parts(n, pc, d, dc)
            pre.append(coef[1] * x1 + coef[2] * x2)
            dec.append(coef[3] * y1 + coef[4] * y2)
        now = [p >= q for p, q in zip(pre, dec)]
        if now == split:
            break
        split = now
        x = []
        for (n, pc, d, dc, _), p in zip(rows, split):
            (x1, x2), (y1, y2) = parts(n, pc, d, dc)
            x.append((1, x1, x2, 0, 0) if p else (1, 0, 0, y1, y2))
        coef = fit(x, [r[4] for r in rows])

    def err(predict):
        return statistics.median(abs(predict(r) - r[4]) / r[4] for r in rows[mixed:])

    def additive(r):
        (x1, x2), (y1, y2) = parts(*r[:4])
        return add[0] + add[1] * x1 + add[2] * x2 + add[3] * y1 + add[4] * y2

    def maximum(r):
        (x1, x2), (y1, y2) = parts(*r[:4])
        return coef[0] + max(coef[1] * x1 + coef[2] * x2, coef[3] * y1 + coef[4] * y2)

    return {"max": err(maximum), "additive": err(additive)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default="/tmp/vllm-venv")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    log_dir = tempfile.mkdtemp(prefix="calibrate-step-")
    pool = engines.Pool(2000, batched_tokens=2048, max_model_len=4096)
    real = engines.Vllm(args.venv, engines.model_dir(log_dir), pool, log_dir,
                        ["--enable-logging-iteration-details"], log_level="INFO")
    rng = random.Random(args.seed)
    try:
        real.wait_up(900)
        log = Log(real.log_path)
        complete(real.url, [5] * 64, 4)  # warm-up
        log.since_mark()
        prefill = pure_prefill(real.url, log, rng, args.reps)
        decode = pure_decode(real.url, log, rng)
        mix = mixed(real.url, log, rng, args.reps)
    finally:
        real.stop()
    if len(prefill) < 10 or len(decode) < 10 or not mix:
        print(f"too few steps logged: prefill {len(prefill)}, decode {len(decode)}, "
              f"mixed {len(mix)} (logs {log_dir})")
        return 1
    # prefill(n, c) = a + b n + g n (c + n / 2); decode(d, c) = a + e d + f d c.
    p = fit([(1, n, n * (c + n / 2)) for n, c, _ in prefill], [t for *_, t in prefill])
    q = fit([(1, d, d * c) for d, c, _ in decode], [t for *_, t in decode])

    def prefill_ms(n, c):
        return p[0] + p[1] * n + p[2] * n * (c + n / 2)

    def decode_ms(d, c):
        return q[0] + q[1] * d + q[2] * d * c

    # Where the decode part is at least 40% of the prefill part (or the reverse) the two
    # forms differ most: the discriminating steps.
    err = {"max": [], "additive": []}
    sharp = {"max": [], "additive": []}
    lines = []
    for n, d, c, t in mix:
        pm, dm = prefill_ms(n, 0), decode_ms(d, c)
        for form, pred in (("max", max(pm, dm)), ("additive", pm + dm - q[0])):
            err[form].append(abs(pred - t) / t)
            if min(pm, dm) >= 0.4 * max(pm, dm):
                sharp[form].append(abs(pred - t) / t)
        lines.append((n, d, c, t, pm, dm))
    print(f"L3 step-time form, real vLLM on this CPU: {len(prefill)} prefill, {len(decode)} "
          f"decode, {len(mix)} mixed steps (logs {log_dir})")
    print(f"prefill ms = {p[0]:.2f} + {p[1] * 1e3:.3f}/1K tokens + {p[2] * 1e6:.4f}/M pairs; "
          f"decode ms = {q[0]:.2f} + {q[1]:.3f}/seq + {q[2] * 1e3:.4f}/1K context tokens")
    print("mixed steps (new tokens, decodes, context): measured ms | prefill part | "
          "decode part")
    for key in sorted({(n, d, c) for n, d, c, *_ in lines}):
        ts = [x for x in lines if x[:3] == key]
        print(f"  {key}: {statistics.median(x[3] for x in ts):7.1f} | "
              f"{ts[0][4]:6.1f} | {ts[0][5]:6.1f}")
    summary = {form: statistics.median(e) for form, e in err.items()}
    for form, e in summary.items():
        where = (f", {statistics.median(sharp[form]):6.1%} on the {len(sharp[form])} where "
                 "the parts are within 2.5x" if sharp[form] else "")
        print(f"{form:8s} form: median error {e:6.1%} on mixed steps{where}")
    best = min(summary, key=summary.get)
    print(f"the {best} form explains this engine's mixed steps better")
    joint = joint_fits(prefill, decode, mix)
    for form, e in joint.items():
        print(f"{form:8s} form fitted on every step: median error {e:6.1%} on mixed steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_error": summary, "joint_fit_error": joint, "best": best, "prefill_fit": list(p),
                       "decode_fit": list(q), "mixed": lines}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
