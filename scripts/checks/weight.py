#!/usr/bin/env python3
"""The library's weight budget: lines outside test files of src/ (the library) and of store/src/
(the nvfipc-store crate it is built on, which the CLI and any Rust program may use alone), each
within a budget of its own, and their process-wide statics.

Test files are `tests.rs` and anything under a `tests/` folder. The line budget was 25,000 when
the library was consolidated; it is 25,300 since ranks that disagree on their job are told at once
(the context's hello records, about 230 lines) and the driver's cold-path calls are timed for
`nvfipc bench` (about 80), and 26,000 since the store is treated as public (records sealed
in memfds offered by the responder, the kernel's checks of responders, processes, files and
boards: about 640), and 26,350 since the store server bounds its pending requests (a
budget of WAIT registrations and partly read frames, about 280) and every count and length given
through the C ABI is checked against a documented limit (about 70). The TCPStore protocol then
became the crate nvfipc-store (store/): its lines moved out of src/ and are counted under store/src/
(budgets 22,000 and 4,650: 26,650 together, 300 more than before). The split itself costs about
270 lines that one crate did not need: the crate's own error type and the `From` into the
library's (src/store/tcp.rs, with `Store` over its client), the crate documentation with its
runnable example, the client's methods documented as a public API of their own, and the socket
helpers' module head; they buy a store with no CUDA and nothing of the library, which the CLI's
`serve` and other Rust programs use alone. src/ is 22,250 since the crate's surface is three
public modules (src/tools.rs lists, each with its reason, the internals the CLI and the tests
reach: about 80), the board checks its entry indexes in release builds (about 25), the exchange
lives in files named for their jobs (batch, protocol, waits: module heads and imports, about 40)
and a warm call allocates nothing (requests reused at the C boundary, liveness and load read into
stack buffers: about 60). src/ is 22,300 since the cache's teardown and its symmetric calls left
cache.rs for files of their own, and each module's settings left config.rs for a file beside
the module (module heads and imports, about 30). src/ is 22,650 since a cached exchange proves a
device buffer unchanged with one short pointer query instead of resolving it again, and a new
tensor inside an allocation exchanged before is carved from it the same way (the bounded memo of
cuda/resolved.rs and the two identity queries of cuda/memory.rs: about 220; warm at W = 8 went
from 2.06 to 1.28 us on an H100) and the driver clock is readable through the C ABI
(`nvfipc_cuda_driver_clock`, about 60). Lower the budgets again as code goes; raise them only with a reason
written here. Every `static` must be preceded
(within the three lines above it) by a comment starting `// process-wide:` that says why the
process, not an object, owns it.

No source file outside test files, of the library, the store crate or the CLI, is longer than
MAX_FILE_LINES: a file that grows past it holds more than one job and is split by job.
"""
import os
import re
import sys

MAX_LINES = {"src": 22_650, "store/src": 4_650}
MAX_STATICS = 20
MAX_FILE_LINES = 800
FILE_TREES = ("src", "store/src", "cli/src")

repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def sources(tree):
    """(path from the repository root, lines) of every .rs file of `tree` outside test files."""
    for folder, _, files in os.walk(os.path.join(repo, tree)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, repo)
            if not name.endswith(".rs") or name == "tests.rs" or "/tests/" in rel:
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read().split("\n")
            if text and text[-1] == "":
                text.pop()
            yield rel, text


statics = []
unexplained = []
failed = False
for tree, budget in MAX_LINES.items():
    lines = 0
    for rel, text in sources(tree):
        lines += len(text)
        for i, line in enumerate(text):
            if re.search(r"\bstatic [A-Z_][A-Z0-9_]*\s*:", line) and not line.lstrip().startswith("//"):
                statics.append(f"{rel}:{i + 1}")
                if not any("// process-wide:" in above for above in text[max(0, i - 3):i]):
                    unexplained.append(f"{rel}:{i + 1}: {line.strip()}")
    print(f"{tree}/ outside test files: {lines} lines (budget {budget})")
    if lines > budget:
        print(f"{tree}/ is over its line budget by {lines - budget}", file=sys.stderr)
        failed = True

too_long = [f"{rel}: {len(text)} lines" for tree in FILE_TREES for rel, text in sources(tree)
            if len(text) > MAX_FILE_LINES]
print(f"files of {', '.join(FILE_TREES)} over {MAX_FILE_LINES} lines: {len(too_long)}")
if too_long:
    print(f"split by job (at most {MAX_FILE_LINES} lines a file):", *too_long, sep="\n  ", file=sys.stderr)
    failed = True

print(f"statics: {len(statics)} (budget {MAX_STATICS})")
if len(statics) > MAX_STATICS:
    print("over the statics budget:", *statics, sep="\n  ", file=sys.stderr)
    failed = True
if unexplained:
    print("statics without a '// process-wide:' reason above them:", *unexplained, sep="\n  ", file=sys.stderr)
    failed = True
sys.exit(1 if failed else 0)
