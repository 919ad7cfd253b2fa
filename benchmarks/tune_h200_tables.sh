#!/usr/bin/env bash
# Fill the H200 tuned table (studies/tuned/h200.json) with short searches over the shipped shape matrix:
# d64/d128 × fp16/bf16 × causal or not at seqlen 4096, plus d128 fp16 at other sequence lengths.
# Usage (GPU host, repo root): STORAGE=sqlite:///$PWD/studies/h200.db TRIALS=16 LIMIT_S=20 bash benchmarks/tune_h200_tables.sh
# then: autotune export studies/tuned/h200.json --gpu H200 --storage "$STORAGE"
set -u
STORAGE=${STORAGE:-sqlite:///$PWD/studies/h200.db}
TRIALS=${TRIALS:-16}
LIMIT_S=${LIMIT_S:-20}
run() {  # one search; its summary lines (not the per-trial progress) go to stdout
  timeout -k 10 $((LIMIT_S + 40)) python3 -m autotune.cli search --trials "$TRIALS" --timeout "$LIMIT_S" \
    --storage "$STORAGE" "$@" 2>&1 | grep -E "^  (best|stored|sdpa)" 
}
for dtype in fp16 bf16; do
  for causal in "" "--causal"; do
    run --seqlen 4096 --head-dim 64 --heads 32 --dtype $dtype $causal
    run --seqlen 4096 --head-dim 128 --heads 16 --dtype $dtype $causal
  done
done
run --seqlen 512 --batch 16 --heads 16
run --seqlen 1024 --batch 8 --heads 16
run --seqlen 2048 --batch 4 --heads 16
run --seqlen 8192 --batch 2 --heads 16
run --seqlen 16384 --batch 1 --heads 16
run --seqlen 16384 --batch 1 --heads 16 --causal
