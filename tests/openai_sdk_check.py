"""Drives an OwnerServe router with the official openai SDK.

Usage: python3 openai_sdk_check.py BASE_URL MODEL
Exits non-zero (with a traceback) on the first failed check.
"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

# Non-streaming.
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Hello from the SDK"}],
    max_tokens=8,
)
assert r.object == "chat.completion", r
assert r.choices[0].message.role == "assistant"
assert r.choices[0].message.content, r
assert r.choices[0].finish_reason == "length", r
assert r.usage.completion_tokens == 8, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + 8, r.usage

# Streaming with usage.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Stream to me"}],
    max_tokens=6,
    stream=True,
    stream_options={"include_usage": True},
)
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text, "no streamed text"
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 6, usage

# Text completions.
c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, n=2, temperature=0.7)
assert len(c.choices) == 2 and c.usage.completion_tokens == 8, c

# Errors carry the right status.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404, e
    assert e.body["code"] == "model_not_found", e.body

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=1)
    raise AssertionError("empty messages were accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, e
    assert e.body["param"] == "messages", e.body

models = client.models.list()
assert [m.id for m in models.data] == [model], models

print("all openai SDK checks passed")
