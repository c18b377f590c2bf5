"""Drives an OwnerServe router's coding-agent APIs with the official SDKs: openai's
Responses (`responses.create` streaming and not, a 5-turn `previous_response_id` chain
with `store=True`, `retrieve`, `cancel`) and anthropic's Messages (`messages.create`
streaming and not, a system prompt, tool use, `count_tokens`, errors).

Usage: python3 agent_sdk_check.py BASE_URL MODEL [--real]
Prints `worker <id> <x-ownerserve-worker>` for every stored response, so the caller can
check each chain stayed on one worker. Exits non-zero on the first failed check.

`--real`: the engines behind the router are real (vLLM with random weights,
scripts/real_vllm/suite.py): an answer may end early at an end-of-sequence token (even at
its first token, then without text), so token counts are bounded instead of exact, text
may be empty, and `ignore_eos` is not sent.
"""
import sys

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
real = "--real" in sys.argv[3:]
oai = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
ant = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)


def counted(n, limit):
    """`n` output tokens for a limit of `limit`: exactly, or (real engines) 1 to limit."""
    return 1 <= n <= limit if real else n == limit


def said(text):
    """Text of an answer: some, or (real engines) any."""
    return isinstance(text, str) and (real or bool(text))


def first_text(message):
    """An Anthropic message's first text block ("" when a real engine said nothing)."""
    blocks = [b for b in message.content if b.type == "text"]
    assert blocks or real, message
    return blocks[0].text if blocks else ""


def ended(status):
    """A response stopped by its token limit (or, real engines, by end of sequence)."""
    return status in (("incomplete", "completed") if real else ("incomplete",))

# --- Responses, not streamed.
raw = oai.responses.with_raw_response.create(model=model, input="Hello from the SDK", max_output_tokens=8)
r = raw.parse()
assert r.object == "response" and r.id.startswith("resp_"), r
assert ended(r.status), r.status  # stopped by max_output_tokens
assert said(r.output_text), r
assert counted(r.usage.output_tokens, 8) and r.usage.input_tokens > 0, r.usage
print("worker", r.id, raw.headers["x-ownerserve-worker"])

# --- Responses, streamed: the event types in order.
kinds, text, done = [], "", None
with oai.responses.create(model=model, input="Stream to me", max_output_tokens=6, stream=True) as stream:
    for ev in stream:
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            done = ev.response
assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"], kinds
assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done"] and ended(kinds[-1][len("response."):]), kinds
assert said(text) and done is not None and done.output_text == text, (text, done)

# --- A 5-turn chain: each turn continues the stored one before; all on one worker.
prev, workers = None, set()
for turn in range(5):
    raw = oai.responses.with_raw_response.create(
        model=model, input=f"turn {turn}: go on", max_output_tokens=4, store=True,
        previous_response_id=prev, instructions="You are terse.")
    r = raw.parse()
    assert r.previous_response_id == prev, (r.previous_response_id, prev)
    workers.add(raw.headers["x-ownerserve-worker"])
    print("worker", r.id, raw.headers["x-ownerserve-worker"])
    if turn > 0:
        # The stored conversation is the prompt: it grows every turn.
        assert r.usage.input_tokens > last_input, (r.usage.input_tokens, last_input)
    last_input = r.usage.input_tokens
    prev = r.id
assert len(workers) == 1, workers
got = oai.responses.retrieve(prev)
assert got.id == prev and ended(got.status) and said(got.output_text), got

# --- Cancel a background response; a finished one cannot be cancelled.
# `ignore_eos` (vLLM's Responses API takes it too): the random model's extra end-of-sequence
# ids could end the story before the cancel, and a finished response cannot be cancelled.
# Long enough to outlast the router holding the answer back until the directory has its
# owner (up to the 5 s claim timeout on a starved 2-core machine): a tiny CPU model decodes
# ~1,000 tokens a second, and 4,000 once finished first (CI, stop 71).
bg = oai.responses.create(model=model, input="A long story", max_output_tokens=60000, store=True,
                          background=True, extra_body={"ignore_eos": True})
assert bg.status in ("queued", "in_progress"), bg.status
c = oai.responses.cancel(bg.id)
assert c.status == "cancelled", c.status
assert oai.responses.retrieve(bg.id).status == "cancelled"
try:
    oai.responses.cancel(prev)
    raise AssertionError("a finished response was cancelled")
except openai.BadRequestError:
    pass
try:
    oai.responses.retrieve("resp_nope")
    raise AssertionError("an unknown response was found")
except openai.NotFoundError:
    pass
try:
    oai.responses.create(model=model, input=[])
    raise AssertionError("empty input was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "input", e.body

# --- Anthropic Messages, not streamed, with a system prompt.
m = ant.messages.create(model=model, max_tokens=8, system="You are terse.",
                        messages=[{"role": "user", "content": "Hello"}])
assert m.type == "message" and m.role == "assistant", m
assert said(first_text(m)), m
assert m.stop_reason in (("max_tokens", "end_turn") if real else ("max_tokens",)), m
assert counted(m.usage.output_tokens, 8), m

# --- Streamed: the event sequence, and the SDK's accumulated message.
events = []
with ant.messages.stream(model=model, max_tokens=6, messages=[{"role": "user", "content": "Stream"}]) as s:
    for ev in s:
        events.append(ev.type)
    final = s.get_final_message()
raw_kinds = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                        "content_block_stop", "message_delta", "message_stop")]
assert raw_kinds[0] == "message_start" and raw_kinds[1] == "content_block_start", raw_kinds
assert raw_kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], raw_kinds
assert said(first_text(final)) and counted(final.usage.output_tokens, 6), final

# --- Tool use: tools offered, a tool_use turn and its tool_result sent back.
tools = [{"name": "ls", "description": "List files", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
m = ant.messages.create(model=model, max_tokens=8, tools=tools, messages=[
    {"role": "user", "content": "List the files"},
    {"role": "assistant", "content": [{"type": "text", "text": "Listing."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.rs\nb.rs"}]},
])
assert said(first_text(m)) and m.usage.input_tokens > 0, m

# --- Token count, beta query string, and Anthropic-shaped errors.
n = ant.messages.count_tokens(model=model, system="You are terse.", messages=[{"role": "user", "content": "Hello"}])
assert n.input_tokens > 0, n
m = ant.beta.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "beta"}],
                             betas=["context-management-2025-06-27"])
assert said(first_text(m)), m
try:
    ant.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    raise AssertionError("unknown model was accepted")
except anthropic.NotFoundError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
try:
    ant.messages.create(model=model, max_tokens=4, messages=[{"role": "wizard", "content": "x"}])
    raise AssertionError("a bad role was accepted")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error", e.body

print("all agent SDK checks passed")
