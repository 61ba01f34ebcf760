#!/usr/bin/env python3
"""Checks docs/ARCHITECTURE.md against the code, so the map cannot drift from the territory.

The document carries its claims in two fenced blocks this script reads:

  ```layers            one layer per line, top first; a line lists the rooms (top-level modules
                       of src/, or workspace crates written as crate:<dir>) of that layer. A room
                       may use only rooms on lower lines: never one on its own line or above.
  ```never             one claim per line, of two forms:
                         <room> never uses <room> [<room> ...]
                         crate:<dir> never depends on <package> [<package> ...]
                         only <path> [<path> ...] contains <text>
                       (a path is a file or a directory under src/, ending in / for a directory)

and it checks three more things on its own: every room of src/ is placed in the layers (a new
module must be put on the map), every room in the layers exists, and every source path the
document names in backticks (`src/...`, `cli/...` or `<room>/...rs`, unless "(removed)"
follows) exists. Comments, doc comments and
`#[cfg(test)]` modules do not count as uses; test files (tests.rs, tests/) are not read.
Exit status 1 with one line per broken claim.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
SRC = os.path.join(ROOT, "src")


def fenced(text, name):
    """Lines of the ```name block, comments (after " #") dropped."""
    m = re.search(r"^```" + name + r"\s*\n(.*?)^```", text, re.S | re.M)
    if not m:
        sys.exit(f"architecture: docs/ARCHITECTURE.md has no ```{name} block")
    lines = []
    for line in m.group(1).splitlines():
        line = line.split(" #", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def strip_comments(text):
    """Code without // comments (doc comments included) and without #[cfg(test)] modules."""
    out = []
    for line in text.split("\n"):
        i = line.find("//")
        out.append(line if i < 0 else line[:i])
    code = "\n".join(out)
    return re.split(r"#\[cfg\(test\)\]\s*(?:#\[path\s*=[^\]]*\]\s*)?mod\s+\w+\s*\{", code)[0]


def is_test_file(rel):
    parts = rel.split("/")
    return "tests" in parts[:-1] or parts[-1] == "tests.rs" or parts[-1].startswith("test_")


def source_files():
    """(path relative to src/, room, code) of every non-test source file."""
    for root, _, files in os.walk(SRC):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), SRC)
            if is_test_file(rel) or rel == "lib.rs":
                continue
            room = rel.split("/")[0].removesuffix(".rs")
            with open(os.path.join(root, f)) as fh:
                yield rel, room, strip_comments(fh.read())


def crate_rooms(level):
    """Library name (as code names it) -> room, for the crate:<dir> rooms of the layers."""
    names = {}
    for room in level:
        if room.startswith("crate:"):
            manifest = os.path.join(ROOT, room[len("crate:"):], "Cargo.toml")
            if os.path.isfile(manifest):
                with open(manifest) as fh:
                    m = re.search(r'^name\s*=\s*"([^"]+)"', fh.read(), re.M)
                if m:
                    names[m.group(1).replace("-", "_")] = room
    return names


def dependencies(room):
    """Package names under [dependencies] of a crate:<dir> room's Cargo.toml."""
    with open(os.path.join(ROOT, room[len("crate:"):], "Cargo.toml")) as fh:
        text = fh.read()
    m = re.search(r"^\[dependencies\]\s*\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", m.group(1), re.M)) if m else set()


def uses(code, crates=None):
    """Top-level modules a file's code names through crate::, and the workspace crates it names."""
    names = set(re.findall(r"\bcrate::([a-z_]+)", code))
    for lib, room in (crates or {}).items():
        if re.search(r"\b" + lib + r"::", code):
            names.add(room)
    for group in re.findall(r"\bcrate::\{([^}]*)\}", code, re.S):
        names.update(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
    return names


def main():
    with open(DOC) as fh:
        doc = fh.read()
    errors = []
    layers = [line.split() for line in fenced(doc, "layers")]
    level = {}
    for depth, rooms in enumerate(layers):
        for room in rooms:
            if room in level:
                errors.append(f"layers: {room} is placed twice")
            level[room] = len(layers) - depth  # higher is further up

    files = list(source_files())
    rooms_in_src = {room for _, room, _ in files}
    for room in sorted(rooms_in_src - level.keys()):
        errors.append(f"layers: src/{room} is not on the map; place it in the ```layers block")
    for room in sorted(level):
        if room.startswith("crate:"):
            if not os.path.isfile(os.path.join(ROOT, room[len("crate:"):], "Cargo.toml")):
                errors.append(f"layers: {room} names no workspace crate")
        elif room not in rooms_in_src:
            errors.append(f"layers: {room} is on the map but src/{room} does not exist")

    graph = {}
    crates = crate_rooms(level)
    for rel, room, code in files:
        for used in uses(code, crates) - {room}:
            graph.setdefault((room, used), rel)
    for (room, used), rel in sorted(graph.items()):
        if room in level and used in level and level[used] >= level[room]:
            where = "its own layer" if level[used] == level[room] else "a layer above it"
            errors.append(f"layers: src/{rel} ({room}) uses {used}, which is on {where}")

    for claim in fenced(doc, "never"):
        m = re.fullmatch(r"(\w+) never uses (.+)", claim)
        if m:
            room, banned = m.group(1), m.group(2).split()
            for used in banned:
                if (room, used) in graph:
                    errors.append(f"never: {room} uses {used} (src/{graph[(room, used)]})")
            continue
        m = re.fullmatch(r"(crate:\S+) never depends on (.+)", claim)
        if m:
            room, banned = m.group(1), set(m.group(2).split())
            found = dependencies(room) & banned if room in level else {"(not on the map)"}
            for dep in sorted(found):
                errors.append(f"never: {room} depends on {dep}")
            continue
        m = re.fullmatch(r"only (.+?) contains? (.+)", claim)
        if m:
            allowed, text = m.group(1).split(), m.group(2)
            for rel, _, code in files:
                if text in code and not any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed):
                    errors.append(f"never: src/{rel} contains {text}; only {' '.join(allowed)} may")
            continue
        errors.append(f"never: cannot read the claim '{claim}'")

    # A path followed by "(removed)" names what a decision deleted.
    named = re.findall(r"`([a-z_]+/[a-z_/{},]*\.rs)`(?! \(removed\))", doc)
    for path in sorted(set(named)):
        for expanded in expand(path):
            top = expanded.split("/")[0]
            # A path under a directory of the repository root is read from the root, else from src/.
            full = expanded if os.path.isdir(os.path.join(ROOT, top)) else "src/" + expanded
            module_dir = os.path.join(ROOT, full.removesuffix(".rs"), "mod.rs")
            if not os.path.exists(os.path.join(ROOT, full)) and not os.path.exists(module_dir):
                errors.append(f"paths: the document names `{path}`, but {full} does not exist")

    for e in errors:
        print(f"architecture: {e}")
    if errors:
        print(f"architecture: {len(errors)} claim(s) of docs/ARCHITECTURE.md do not hold")
        return 1
    print(f"architecture: {len(level)} rooms in {len(layers)} layers, {len(graph)} uses, claims hold")
    return 0


def expand(path):
    """`src/store/{wire,client}.rs` -> both files."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [path[: m.start()] + part + path[m.end():] for part in m.group(1).split(",")]


if __name__ == "__main__":
    sys.exit(main())
