#!/usr/bin/env python3
"""The library's weight budget: lines of src/ outside test files, and process-wide statics.

Test files are `tests.rs` and anything under a `tests/` folder. The line budget was 25,000 when
the library was consolidated; it is 25,300 since ranks that disagree on their job are told at once
(the context's hello records, about 230 lines) and the driver's cold-path calls are timed for
`nvfipc bench` (about 80), and 26,000 since the store is treated as public (records sealed
in memfds offered by the responder, the kernel's checks of responders, processes, files and
boards: about 640), and 26,350 since the store server bounds its pending requests (a
budget of WAIT registrations and partly read frames, about 280) and every count and length given
through the C ABI is checked against a documented limit (about 70), and 26,450 since the
crate's surface is three public modules: src/tools.rs lists, each with its reason, the internals
that the CLI and the integration tests reach (about 80, for 17 public modules before), and the
board checks its entry indexes in release builds (about 25). Lower it again as code goes; raise it only with a reason written here. Every `static` must be preceded
(within the three lines above it) by a comment starting `// process-wide:` that says why the
process, not an object, owns it.
"""
import os
import re
import sys

MAX_LINES = 26_450
MAX_STATICS = 20

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
lines = 0
statics = []
unexplained = []
for folder, _, files in os.walk(root):
    for name in sorted(files):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, os.path.join(root, ".."))
        if not name.endswith(".rs") or name == "tests.rs" or "/tests/" in rel:
            continue
        text = open(path, encoding="utf-8").read().split("\n")
        if text and text[-1] == "":
            text.pop()
        lines += len(text)
        for i, line in enumerate(text):
            if re.search(r"\bstatic [A-Z_][A-Z0-9_]*\s*:", line) and not line.lstrip().startswith("//"):
                statics.append(f"{rel}:{i + 1}")
                if not any("// process-wide:" in above for above in text[max(0, i - 3):i]):
                    unexplained.append(f"{rel}:{i + 1}: {line.strip()}")

print(f"src/ outside test files: {lines} lines (budget {MAX_LINES}); statics: {len(statics)} (budget {MAX_STATICS})")
failed = False
if lines > MAX_LINES:
    print(f"over the line budget by {lines - MAX_LINES}", file=sys.stderr)
    failed = True
if len(statics) > MAX_STATICS:
    print("over the statics budget:", *statics, sep="\n  ", file=sys.stderr)
    failed = True
if unexplained:
    print("statics without a '// process-wide:' reason above them:", *unexplained, sep="\n  ", file=sys.stderr)
    failed = True
sys.exit(1 if failed else 0)
