#!/usr/bin/env python3
"""Finds import circles between the modules (files) of a crate.

Usage: scripts/module_cycles.py SRC_DIR [SRC_DIR ...]

Each .rs file is a node. An edge a -> b means file a names an item of file b through
`crate::`, `super::`, or a child module it declares. Unit-test code (`#[cfg(test)]`
modules, files named tests.rs or under a tests/ folder) and `mod` declarations do not
count. Prints every strongly connected set of more than one file and exits 1 if any.
"""
import os
import re
import sys


def module_path(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main") and len(rel) == 1:
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    """Drops `#[cfg(test)] mod name { ... }` blocks and `#[cfg(test)] mod name;` lines."""
    out, i = [], 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*([{;])")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i : m.start()])
        if m.group(3) == ";":
            i = m.end()
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    return "".join(out)


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = tree.strip()
    if "{" not in tree:
        return [tree]
    head, _, rest = tree.partition("{")
    body = rest[: rest.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return [head + p2 for p in parts if p.strip() for p2 in expand_use(p.strip())]


def references(text):
    """Paths the file names: every `use` tree expanded, plus inline `a::b::c` paths."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += expand_use(re.sub(r"\s+", "", m.group(1)))
    paths += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text)
    paths += re.findall(r"\b\w+(?:::\w+)+", text)
    return [re.sub(r"\s+as\s+\w+$", "", p) for p in paths]


def resolve(path, here, modules, children):
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    if parts[0] == "crate":
        base = ()
        parts = parts[1:]
    elif parts[0] in ("super", "self"):
        base = here
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    elif parts[0] in children.get(here, ()):
        base = here
    else:
        return None
    best = None
    for k in range(len(parts), 0, -1):
        cand = base + tuple(parts[:k])
        if cand in modules:
            best = cand
            break
    return best


def scan(src):
    files = {}
    for root, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if d != "tests"]
        for n in names:
            if n.endswith(".rs") and n != "tests.rs":
                p = os.path.join(root, n)
                files[module_path(src, p)] = p
    children = {}
    texts = {}
    for mod, p in files.items():
        text = strip_tests(strip_comments(open(p, encoding="utf-8").read()))
        texts[mod] = text
        children[mod] = set(re.findall(r"\bmod\s+(\w+)\s*;", text))
    edges = {mod: set() for mod in files}
    for mod, text in texts.items():
        for path in references(text):
            target = resolve(path, mod, files, children)
            if target is not None and target != mod and target != ():
                edges[mod].add(target)
    return files, edges


def cycles(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    failed = False
    for src in sys.argv[1:]:
        files, edges = scan(src)
        found = cycles(edges)
        name = lambda m: "::".join(m) or "<root>"
        for comp in found:
            failed = True
            members = sorted(comp)
            print(f"{src}: import circle among {', '.join(name(m) for m in members)}")
            for m in members:
                inside = sorted(name(t) for t in edges[m] if t in comp)
                print(f"  {name(m)} -> {', '.join(inside)}")
        if not found:
            print(f"{src}: {len(files)} modules, no import circle")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
