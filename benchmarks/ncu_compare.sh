#!/usr/bin/env bash
# Profile our kernel and FlashAttention-4's on one shape in one Nsight Compute run (benchmarks/ncu_compare.py),
# clocks left as found (--clock-control none), and print the comparison table.
#   benchmarks/ncu_compare.sh [SHAPE_KEY] OUT_DIR [PROFILE_ARGS...]
# PROFILE_ARGS go to `ncu_compare.py profile` (e.g. --peers cudnn --config KEY: other peers, more of our configs).
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${2:+$1}; shape=${shape:-b4-h16-n4096-d128-fp16-full}
out=${2:-${1:?usage: $0 [SHAPE_KEY] OUT_DIR [PROFILE_ARGS...]}}
shift $(( $# < 2 ? $# : 2 ))
profile_args=("$@")
mkdir -p "$out"
run_ncu() {  # run_ncu METRICS
  ncu --clock-control none --profile-from-start off --metrics "$1" --csv --page raw --log-file "$out/ncu-raw.csv" \
      python3 benchmarks/ncu_compare.py profile --shape "$shape" ${profile_args[@]+"${profile_args[@]}"} 2>"$out/ncu-stderr.log"
}
run_ncu "$(python3 benchmarks/ncu_compare.py metrics)" \
  || run_ncu "$(python3 benchmarks/ncu_compare.py metrics --explicit)" \
  || { tail -20 "$out/ncu-stderr.log" "$out/ncu-raw.csv" >&2; exit 1; }
python3 benchmarks/ncu_compare.py table "$out/ncu-raw.csv" | tee "$out/ncu-table.md"
