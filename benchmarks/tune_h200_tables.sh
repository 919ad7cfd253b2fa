#!/usr/bin/env bash
# Fill the H200 tuned table (studies/tuned/h200.json) with short searches over the shipped shape matrix:
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
# The seqlen-4096 shapes of docs/benchmarks.md (d128 fp16 ± causal, d64 fp16, d128 bf16) have longer searches of
# their own there; these fill in the rest of the d64/d128 × fp16/bf16 × causal matrix and other lengths.
run --seqlen 4096 --head-dim 64 --heads 32 --causal
run --seqlen 4096 --head-dim 64 --heads 32 --dtype bf16
run --seqlen 4096 --head-dim 64 --heads 32 --dtype bf16 --causal
run --seqlen 4096 --head-dim 128 --heads 16 --dtype bf16 --causal
run --seqlen 512 --batch 16 --heads 16
run --seqlen 1024 --batch 8 --heads 16
run --seqlen 2048 --batch 4 --heads 16
run --seqlen 8192 --batch 2 --heads 16
run --seqlen 16384 --batch 1 --heads 16
run --seqlen 16384 --batch 1 --heads 16 --causal
