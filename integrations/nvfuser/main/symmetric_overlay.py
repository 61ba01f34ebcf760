#!/usr/bin/env python3
"""Puts nvFuser main's SymmetricTensor set-up on nvfuser-ipc (NVIDIA/Fuser 81c4b22fd).

Usage: symmetric_overlay.py NVFUSER_SOURCE_DIR

Edits NVFUSER_SOURCE_DIR/csrc/multidevice/symmetric_tensor.cpp in place, together with the
drop-in integrations/nvfuser/main/ipc_handle.{h,cpp} (which must replace nvFuser's own: the
functions called here live there). nvFuser's API and the rest of the file are unchanged:

  setupRemoteHandles(tag)   one nvfuser-ipc symmetric rendezvous instead of a Unix socket per
                            rank and tag, two world barriers and an fd sent to every peer: each
                            rank waits only for the peers it maps
  setupContiguousView(tag)  the library's contiguous view (every rank's copy in rank order in
                            one virtual range) over the mappings of that rendezvous
  ~SymmetricTensor()        unmapping the peers' copies and the view is the library's release

Multicast (setupMulticast) stays nvFuser's own: it uses only this rank's allocation handle and
pointer, which the constructor still sets up. Applying the overlay twice is an error; so is a
file whose functions no longer look as expected (the script names what it did not find).
"""
import sys
from pathlib import Path

MARK = "// nvfuser-ipc overlay"


def body_span(text: str, signature: str, unique: bool = True) -> tuple[int, int]:
    """Start and end (exclusive) of the braces opened by the first `signature` (with `unique`,
    the only one in `text`)."""
    at = text.find(signature)
    if at < 0 or (unique and text.find(signature, at + 1) >= 0):
        raise SystemExit(f"symmetric_overlay: expected exactly one '{signature}'")
    open_brace = text.index("{", at + len(signature) - 1)
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return open_brace, i + 1
    raise SystemExit(f"symmetric_overlay: unbalanced braces after '{signature}'")


def replace_body(text: str, signature: str, body: str) -> str:
    start, end = body_span(text, signature)
    return text[:start] + "{\n" + body + "}" + text[end:]


def replace_block(text: str, within: str, opener: str, block: str) -> str:
    """Replaces the braced block opened by `opener` inside the definition opened by `within`."""
    fn_start, fn_end = body_span(text, within)
    at = text.find(opener, fn_start, fn_end)
    if at < 0:
        raise SystemExit(f"symmetric_overlay: '{opener}' not found in '{within}'")
    start, end = body_span(text[at:], opener, unique=False)
    return text[:at] + block + text[at + end:]


def apply(text: str) -> str:
    if MARK in text:
        raise SystemExit("symmetric_overlay: already applied")
    include = '#include "multidevice/symmetric_tensor.h"\n'
    if text.count(include) != 1:
        raise SystemExit(f"symmetric_overlay: expected exactly one {include.strip()}")
    text = text.replace(
        include,
        include + f'{MARK}: set-up through nvfuser-ipc (integrations/nvfuser/main)\n'
        '#include "multidevice/ipc_handle.h"\n',
    )
    text = replace_block(
        text,
        "SymmetricTensor::~SymmetricTensor() {",
        "if (are_remote_tensors_setup_ == true) {",
        "if (are_remote_tensors_setup_) {\n"
        f"    {MARK}: the library unmaps the peers' copies and the contiguous view.\n"
        "    nvfipc_symmetric::release(this);\n"
        "  }",
    )
    text = replace_body(
        text,
        "void SymmetricTensor::setupRemoteHandles(const std::string& tag) {",
        f"  {MARK}: one symmetric rendezvous, no sockets, no world barrier.\n"
        "  if (are_remote_tensors_setup_) {\n"
        "    return;\n"
        "  }\n"
        "  remote_ptrs_ = nvfipc_symmetric::setupRemoteHandles(this, local_tensor_, tag);\n"
        "  are_remote_tensors_setup_ = true;\n",
    )
    text = replace_body(
        text,
        "void SymmetricTensor::setupContiguousView(const std::string& tag) {",
        f"  {MARK}: the library's contiguous view over the rendezvous' mappings.\n"
        "  (void)tag;\n"
        "  if (is_contiguous_view_setup_) {\n"
        "    return;\n"
        "  }\n"
        "  NVF_CHECK(\n"
        "      are_remote_tensors_setup_,\n"
        '      "Remote tensors must be setup before setupContiguousView");\n'
        "  contiguous_view_ = nvfipc_symmetric::contiguousView(this, local_tensor_);\n"
        "  is_contiguous_view_setup_ = true;\n",
    )
    return text


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    path = Path(sys.argv[1]) / "csrc/multidevice/symmetric_tensor.cpp"
    path.write_text(apply(path.read_text()))
    print(f"symmetric_overlay: {path} now sets up remote handles through nvfuser-ipc")


if __name__ == "__main__":
    main()
