#!/bin/sh
# Instructions per lock+release under callgrind, for each implementation: two runs that
# differ only in the number of measured lock+release pairs (100 and 1100, after 200 warm
# ones); the difference of their totals over 1000 is the cost of one pair in this process
# (the redis-server nodes are separate processes and are not traced).
#   benches/instructions.sh [impl...]     (default: floor ours rslock redlock-rs)
# PROFILE=profiling builds with line tables (file:line in `callgrind_annotate`).
# BENCH_RUNTIME=multi runs the client on a one-worker multi-thread runtime (default: current-thread).
set -eu
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
cargo build --profile "$profile" -q -p redlock-benches --bin instructions
dir=$profile; [ "$profile" = dev ] && dir=debug
bin=${CARGO_TARGET_DIR:-target}/$dir/instructions
out=${TMPDIR:-/tmp}/redlock-callgrind
mkdir -p "$out"
for imp in ${@:-floor ours rslock redlock-rs}; do
  for m in 100 1100; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$imp.$m" \
      "$bin" "$imp" 200 "$m" 2>/dev/null
  done
  a=$(sed -n 's/^summary: //p' "$out/$imp.100")
  b=$(sed -n 's/^summary: //p' "$out/$imp.1100")
  echo "$imp: $(( (b - a) / 1000 )) instructions per lock+release ($out/$imp.1100)"
done
