#!/usr/bin/env bash
# The three coding agents as a user runs them, headless, against `ownerserve up`: Claude Code
# 2.1.328 (Anthropic Messages), Codex CLI 0.169.0 (OpenAI Responses) and OpenCode 1.18.33
# (chat completions), installed from the npm registry at these pinned versions into a cache
# ($OWNERSERVE_AGENTS_CACHE, default ~/.cache/ownerserve/agents; ~1.1 GB, once). Each runs a
# turn and a follow-up turn of one conversation, each in its own empty HOME on loopback;
# then /admin/v1/sessions must hold exactly one session per conversation (side requests, such
# as OpenCode's title, make none).
#
# Usage: scripts/agents/check.sh [path/to/ownerserve]
#
# Against a router that is already running (real engines behind it:
# scripts/real_vllm/suite.py), set OWNERSERVE_AGENTS_TARGET=http://HOST:PORT,
# OWNERSERVE_AGENTS_MODEL (the served model's id) and OWNERSERVE_AGENTS_ADMIN_TOKEN (its
# admin token; the router needs a directory for /admin/v1/sessions). A model with random
# weights says nothing in particular, so a turn must then only end well with some text.
# OWNERSERVE_AGENTS_MAX_OUTPUT caps answers through each harness's own setting (Claude Code
# then fails an answer that reaches the cap; the real-engine suite instead gives its model
# extra end-of-sequence tokens).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/debug/ownerserve}
cache=${OWNERSERVE_AGENTS_CACHE:-$HOME/.cache/ownerserve/agents}
packages="@anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0 opencode-ai@1.18.33"
target=${OWNERSERVE_AGENTS_TARGET:-}
model=${OWNERSERVE_AGENTS_MODEL:-meta-llama/Llama-3.1-8B-Instruct}
max_output=${OWNERSERVE_AGENTS_MAX_OUTPUT:-}

if [ "$(cat "$cache/installed" 2>/dev/null)" != "$packages" ]; then
  mkdir -p "$cache"
  (cd "$cache" && npm install --no-audit --no-fund --loglevel=error $packages)
  echo "$packages" > "$cache/installed"
fi
export PATH="$cache/node_modules/.bin:$PATH"

work=$(mktemp -d)
if [ -n "$target" ]; then
  token=${OWNERSERVE_AGENTS_ADMIN_TOKEN:?set it to the target router admin token}
  base=$target
  trap 'rm -rf "$work"' EXIT
else
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  token=agents-check-token
  OWNERSERVE_ADMIN_TOKEN=$token OWNERSERVE_LOG=warn "$bin" up --port "$port" --time-scale 20 >"$work/up.log" 2>&1 &
  up_pid=$!
  trap 'kill $up_pid 2>/dev/null || true; wait $up_pid 2>/dev/null || true; rm -rf "$work"' EXIT
  for _ in $(seq 100); do grep -q "listening on" "$work/up.log" && break; sleep 0.2; done
  grep -q "listening on" "$work/up.log" || { cat "$work/up.log"; echo "ownerserve up did not start"; exit 1; }
  base="http://127.0.0.1:$port"
fi

# One turn; fails unless the agent exits 0 with text of the model's answer: words of the
# passage the simulated engine samples its text from (workers-shim/src/sim/filler.rs). An
# answer may start and end anywhere in it, so any of several words will do.
answer_words="Lorem\|ipsum\|dolor\|amet\|consectetur\|adipiscing\|eiusmod\|tempor\|incididunt\|labore\|magna\|aliqua\|veniam\|nostrud\|exercitation\|ullamco\|laboris\|aliquip\|commodo\|consequat\|irure\|reprehenderit\|voluptate\|cillum\|fugiat\|pariatur"
# Against real engines with random weights: any non-blank answer. A turn there runs an
# agent-sized prompt through a CPU engine: 7–160 s per turn were seen on one machine, so a
# turn gets 600 s there (300 s against the simulated engine, which answers in seconds).
turn_timeout=300
if [ -n "$target" ]; then answer_words='[^[:space:]]'; turn_timeout=600; fi
turn() {
  local name=$1; shift
  local out="$work/$name.out"
  local started=$SECONDS
  if ! timeout "$turn_timeout" "$@" >"$out" 2>&1 || ! grep -q "$answer_words" "$out"; then
    echo "$name failed:"; cat "$out"; exit 1
  fi
  echo "$name: ok in $((SECONDS - started)) s"
}

# Claude Code: Anthropic Messages at /v1/messages?beta=true.
home="$work/claude"; mkdir -p "$home/proj"
claude_env=(env HOME="$home" ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY=any
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1
  DISABLE_AUTOUPDATER=1)
if [ -n "$max_output" ]; then claude_env+=(CLAUDE_CODE_MAX_OUTPUT_TOKENS="$max_output"); fi
(cd "$home/proj" && turn "claude turn 1" "${claude_env[@]}" claude -p "Say hi" --model "$model")
(cd "$home/proj" && turn "claude turn 2" "${claude_env[@]}" claude -p "And again" --continue --model "$model")

# Codex: OpenAI Responses at /v1/responses.
home="$work/codex"; mkdir -p "$home/.codex" "$home/proj"
cat >"$home/.codex/config.toml" <<TOML
model = "$model"
model_provider = "ownerserve"
[model_providers.ownerserve]
name = "OwnerServe"
base_url = "$base/v1"
wire_api = "responses"
env_key = "OWNERSERVE_KEY"
[analytics]
enabled = false
TOML
if [ -n "$max_output" ]; then
  # Top-level keys must come before the tables.
  { echo "model_max_output_tokens = $max_output"; cat "$home/.codex/config.toml"; } >"$home/.codex/c.toml"
  mv "$home/.codex/c.toml" "$home/.codex/config.toml"
fi
codex_env=(env HOME="$home" OWNERSERVE_KEY=any)
(cd "$home/proj" && turn "codex turn 1" "${codex_env[@]}" codex exec --skip-git-repo-check "Say hi")
(cd "$home/proj" && turn "codex turn 2" "${codex_env[@]}" codex exec --skip-git-repo-check resume --last "And again")

# OpenCode: chat completions at /v1/chat/completions.
home="$work/opencode"; mkdir -p "$home/.config/opencode" "$home/proj"
model_settings="{}"
if [ -n "$max_output" ]; then
  model_settings="{\"limit\": {\"context\": 65536, \"output\": $max_output}}"
fi
cat >"$home/.config/opencode/opencode.json" <<JSON
{"autoupdate": false, "share": "disabled",
 "provider": {"ownerserve": {"npm": "@ai-sdk/openai-compatible", "name": "OwnerServe",
   "options": {"baseURL": "$base/v1", "apiKey": "any"}, "models": {"$model": $model_settings}}}}
JSON
opencode_env=(env HOME="$home")
(cd "$home/proj" && turn "opencode turn 1" "${opencode_env[@]}" opencode run --model "ownerserve/$model" "Say hi")
(cd "$home/proj" && turn "opencode turn 2" "${opencode_env[@]}" opencode run --continue --model "ownerserve/$model" "And again")

# Ownership records are flushed in the background: give them a moment.
sleep 2
# What the directory refused (by command), the sync dropped, or lease expiries ended, if
# anything: why a record or an owner may be missing.
curl -sf "$base/metrics" -H "authorization: Bearer $token" \
  | grep -E '^ownerserve_(directory_rejections_total|ownership_records_dropped_total)|^ownerserve_directory_commands_total.*rejected|^ownerserve_directory_changes_total.*lease_' \
  | grep -v ' 0$' || true
curl -sf "$base/admin/v1/sessions" -H "authorization: Bearer $token" | python3 -c '
import json, sys
sessions = json.load(sys.stdin)["sessions"]
ids = [s["id"] for s in sessions]
# (A shared target may hold sessions of earlier checks; they are not ours.)
assert len(ids) == 3, f"expected one session per conversation (3), got {ids}"
assert sum(i.startswith("ses_") for i in ids) == 1, ids  # OpenCode names its sessions ses_...
# An idle session is demoted when its lease lapses (owner null, its sealed prefix kept).
assert all(s["prefix"] is not None for s in sessions), sessions
print("one session per agent conversation:", ", ".join(ids))
'
# Every step of a session whose owner the directory knew ran on that owner, or, for a
# session demoted after its idle lease, on the owner of its sealed prefix (needs a
# policy that reads the directory: `ownerserve`, as in `up`).
curl -sf "$base/metrics" -H "authorization: Bearer $token" | python3 -c '
import sys
steps = {l.split("\"")[1]: float(l.split()[-1]) for l in sys.stdin
         if l.startswith("ownerserve_session_steps_total{")}
assert steps.get("owner", 0) >= 3 and steps.get("elsewhere", 0) == 0, steps
print("session steps by placement:", steps)
'
