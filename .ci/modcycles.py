#!/usr/bin/env python3
"""Report import cycles between the top-level modules of a crate's `src/`.

Each file belongs to its top-level module (`src/foo.rs` and `src/foo/**` are `foo`). A file
that names `crate::bar` (in a `use`, a `use crate::{bar, ..}` group or an inline path) depends
on `bar`; `super::` paths are resolved the same way. Prints the strongly connected components
with more than one module and exits 1 if there are any (`--report` always exits 0).

`--allow FILE` is the ratchet while known cycles are being taken apart: each line of FILE
lists the modules of one tolerated cycle (comma-separated, `#` comments); a cycle that is not
contained in one of them (a new cycle, or a known one that grew) still fails.
"""
import os
import re
import sys


def top_module(rel):
    parts = rel[:-3].split(os.sep)
    if parts[0] in ("lib", "main"):
        return None
    return parts[0]


def depth(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return len(parts)  # module depth below the crate root


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def group_items(text, start):
    """Top-level names inside the `{...}` that opens at text[start]."""
    level, item, names = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            level += 1
            if level == 1:
                continue
        elif ch == "}":
            level -= 1
            if level == 0:
                names.append(item)
                break
        if level == 1 and ch == ",":
            names.append(item)
            item = ""
        elif level >= 1:
            item += ch
    return [n.strip().split("::")[0].strip() for n in names if n.strip()]


def deps_of(src, d):
    out = set()
    text = strip_comments(src)
    for m in re.finditer(r"\bcrate::(\{|\w+)", text):
        if m.group(1) == "{":
            out.update(group_items(text, m.start(1)))
        else:
            out.add(m.group(1))
    # super::super::x from depth d reaches the crate root after d-1 supers... resolve
    for m in re.finditer(r"\b((?:super::)+)(\{|\w+)", text):
        n = m.group(1).count("super::")
        if n >= d:  # climbs to the crate root
            if m.group(2) == "{":
                out.update(group_items(text, m.start(2)))
            else:
                out.add(m.group(2))
    return {x for x in out if x and x != "self"}


def sccs(graph):
    index, low, stack, on, res, i = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            res.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return res


def main():
    argv = sys.argv[1:]
    allowed = []
    if "--allow" in argv:
        i = argv.index("--allow")
        with open(argv[i + 1], encoding="utf-8") as fh:
            for line in fh:
                line = line.split("#")[0].strip()
                if line:
                    allowed.append({m.strip() for m in line.split(",")})
        del argv[i : i + 2]
    args = [a for a in argv if not a.startswith("--")]
    root = args[0] if args else "broker/src"
    graph = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            mod = top_module(rel)
            if mod is None:
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                deps = deps_of(fh.read(), depth(rel))
            graph.setdefault(mod, set()).update(deps)
    mods = set(graph)
    for m in graph:
        graph[m] = {d for d in graph[m] if d in mods and d != m}
    cycles = [c for c in sccs(graph) if len(c) > 1]
    if not cycles:
        print(f"{root}: no import cycles between its {len(mods)} top-level modules")
        return 0
    failed = False
    for c in cycles:
        known = any(set(c) <= a for a in allowed)
        failed |= not known
        tag = "known" if known else "NEW"
        print(f"{root}: {tag} import cycle among {len(c)} modules: {', '.join(c)}")
        for m in c:
            inside = sorted(d for d in graph[m] if d in c)
            print(f"  {m} -> {', '.join(inside)}")
    return 1 if failed and "--report" not in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
