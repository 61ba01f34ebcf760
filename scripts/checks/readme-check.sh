#!/usr/bin/env bash
# Compiles and runs the README's C example exactly as printed: the code block after the marker
# `<!-- readme-check: ring.c -->` is written to ring.c, and the shell block after
# `<!-- readme-check: run -->` is run line by line from the repository root (with `set -e`).
# ring.c and the program it builds are removed afterwards. Fails when either block is missing,
# when a command fails, or when the program reports a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

block() { # the fenced block after marker $1
    awk -v marker="<!-- readme-check: $1 -->" '
        $0 == marker { found = 1; next }
        found == 1 && /^```/ { found = 2; next }
        found == 2 && /^```/ { exit }
        found == 2 { print }
    ' README.md
}

c_code="$(block ring.c)"
commands="$(block run)"
if [ -z "$c_code" ] || [ -z "$commands" ]; then
    echo "readme-check: README.md lacks the ring.c or run block" >&2
    exit 1
fi
for f in ring.c ring; do
    if [ -e "$f" ]; then
        echo "readme-check: ./$f exists; refusing to overwrite it" >&2
        exit 1
    fi
done
trap 'rm -f ring.c ring' EXIT
printf '%s\n' "$c_code" > ring.c
echo "== README example: ring.c ($(wc -l < ring.c) lines), then:"
printf '%s\n' "$commands"
bash -euo pipefail -c "$commands"
echo "== README example ran as printed"
