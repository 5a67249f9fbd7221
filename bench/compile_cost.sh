#!/usr/bin/env bash
# Compile cost of using the Syncer: the user CPU seconds g++ -O2 spends on a
# translation unit that uses a Syncer (bench/compile_cost/syncer_use.cc)
# against one that only includes its header (include_only.cc, the floor),
# alternating, median of N runs (default 5). Prints both and the ratio.
#
#   bench/compile_cost.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
flags=(-std=c++20 -O2 -DNDEBUG -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL
       -DFMT_SHARED -Iinclude -c -o /dev/null)
time_of() {
  /usr/bin/env time -f %U g++ "${flags[@]}" "$1" 2>&1 >/dev/null | tail -1
}
floor=(); use=()
for ((i = 0; i < runs; ++i)); do
  floor+=("$(time_of bench/compile_cost/include_only.cc)")
  use+=("$(time_of bench/compile_cost/syncer_use.cc)")
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
f=$(median "${floor[@]}"); u=$(median "${use[@]}")
awk -v f="$f" -v u="$u" 'BEGIN { printf "include floor: %s s; syncer use: %s s; ratio: %.2f\n", f, u, u / f }'
