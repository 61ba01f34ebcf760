# Step bookkeeping shared by the resumable GPU-machine suites (scripts/nvfuser/suite.sh,
# scripts/nvfuser/main-suite.sh): each call runs within $BUDGET seconds from $start_s, a marker
# file under $WORK/state records each step done, and a call that runs short of time stops
# successfully with RESUME so that the next call continues. Source it after setting STEPS_NAME
# (message prefix and log archive name), BUDGET, start_s, WORK, OUT, res (the raw logs) and log.

say() { echo "$STEPS_NAME: $*" | tee -a "$log"; }
pack() { tar -czf "$OUT/$STEPS_NAME-logs.tgz" -C "$res" . 2>/dev/null; }
die() {
  say "FAILED: $*"
  pack
  exit 1
}
left() { echo $((BUDGET - ($(date +%s) - start_s))); }
done_() { [ -f "$WORK/state/$1" ]; }
mark() { date +%s >"$WORK/state/$1"; }
# Forgets that these steps were done, with their parts per world and test (markers named
# <step>-w<W>... or <step>-<W>), so that e.g. "mr" runs every several-rank test again.
forget_steps() {
  local step
  for step in "$@"; do
    rm -f "$WORK/state/$step" "$WORK/state/$step"-w[0-9]* "$WORK/state/$step"-[0-9]*
  done
}
# Stops this call (successfully) when fewer than $1 seconds are left: call the script again.
need() {
  if [ "$(left)" -lt "$1" ]; then
    say "RESUME: $(left) s left in this call, the next step needs about $1 s; run the script again"
    pack
    exit 0
  fi
}
