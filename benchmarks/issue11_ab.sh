#!/usr/bin/env bash
# Issue 11, kernel round 1 on the H200: K and V of a ring slot released separately (K as soon as S = Q·Kᵀ has read
# it), and a consumer warpgroup with no query row below seqlen_q only walks the ring instead of computing. First the GPU correctness matrix for the configs the change touches most (d256, two-stage overlapped loops,
# persistent), then before/after A/Bs (benchmarks/kernel_ab.py) of the peer shapes' shipped configs and of the
# configs the change should unlock (two-stage overlapped loops: FlashAttention-3's 128 × 80 d256 and 128 × 176
# d128 tiles); last, eager against CUDA-graph timing on the short shapes (is their gap on the host?). Everything goes
# under $OUT (default ./ab-out); the tables are printed at the end.
#
#   BEFORE=<kernel tree> benchmarks/issue11_ab.sh      # default: `git archive $BASE kernels` of BASE (main's 14c1437)
#
# Budget: < 7 minutes on one H200 (tests capped at TEST_S seconds, then the A/Bs; each step's log under $OUT).
# DRY=1 (no GPU): skip the tests and only build both sides of every A/B for sm_90 (kernel_ab --build-only).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/ab-out}
BASE=${BASE:-14c1437}
TEST_S=${TEST_S:-170}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export AUTOTUNE_CACHE_DIR=${AUTOTUNE_CACHE_DIR:-$OUT/.kcache}
export AUTOTUNE_TEST_CACHE_DIR=$AUTOTUNE_CACHE_DIR

if [ -z "${BEFORE:-}" ]; then
  BEFORE=$PWD/.ab/$BASE/kernels
  if [ ! -d "$BEFORE/common" ]; then
    mkdir -p ".ab/$BASE" && git archive "$BASE" kernels | tar -x -C ".ab/$BASE" || {
      echo "issue11_ab: cannot make the before tree with git archive $BASE; pass BEFORE=<kernel tree>" >&2; exit 2; }
  fi
fi
# Both trees are built with this checkout's space/ (its layout is the launch contract), which counts 4 mbarriers per
# stage; the before tree had 3 (one shared K/V release) and its layout_smem_dynamic static_assert would refuse the
# build. Give a copy of it the same barrier region (the extra barriers sit unused), so only the release logic differs.
rm -rf "$OUT/before-kernels" && cp -r "$BEFORE" "$OUT/before-kernels" && BEFORE=$OUT/before-kernels
if grep -q "kNumBarriers = 1 + 3 \* kStages" "$BEFORE/sm90/traits.cuh"; then
  sed -i 's/kNumBarriers = 1 + 3 \* kStages/kNumBarriers = 1 + 4 * kStages/' "$BEFORE/sm90/traits.cuh"
fi
grep -q "kNumBarriers = 1 + 4 \* kStages" "$BEFORE/sm90/traits.cuh" || {
  echo "issue11_ab: $BEFORE/sm90/traits.cuh: expected kNumBarriers = 1 + 3 or 4 * kStages" >&2; exit 2; }
echo "before tree: $BEFORE" | tee "$OUT/summary.txt"

# 1. correctness: d256 (every config of the matrix, grid/lpt/persistent), the two-stage overlapped ladder entries of
#    two problems, the 3-warpgroup ones of d64 fp16 (a warpgroup with no row below seqlen_q only walks the ring: cases
#    n1, n17, n1000, q100-k300, q300-k100), and ping-pong without overlap (pingpong=1, overlap=0) on two more.
DRY=${DRY:-0}
K="d256 or (-2-1-1- and (d128-fp16-causal or d64-bf16-full)) or ((full-3- or causal-3-) and d64-fp16)"
K="$K or ((-0-1-smem or -0-1-direct) and (d128-bf16-causal or d64-fp16-full))"
echo "== pytest -m gpu tests/test_wgmma_gpu.py -k '$K' (cap ${TEST_S}s)" | tee -a "$OUT/summary.txt"
[ "$DRY" = 1 ] || timeout "$TEST_S" python3 -m pytest -q -n 4 -m gpu tests/test_wgmma_gpu.py -k "$K" -p no:cacheprovider \
  > "$OUT/gpu-tests.log" 2>&1
echo "pytest rc=$? (124 = cut off by the cap)" | tee -a "$OUT/summary.txt"
tail -n 15 "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"

# 2. A/B. Shipped configs (studies/tuned/h200.json) first on each shape, then the two-stage variants.
W=wgmma:consumer_wgs
AB=(python3 benchmarks/kernel_ab.py --before "$BEFORE" --rounds 2)
[ "$DRY" = 1 ] && AB+=(--build-only --arch sm_90)
ab() {  # name, then kernel_ab arguments
  local name=$1; shift
  echo "== A/B $name" | tee -a "$OUT/summary.txt"
  "${AB[@]}" --out "$OUT/ab-$name" "$@" > "$OUT/ab-$name.log" 2>&1
  echo "rc=$?" >> "$OUT/summary.txt"
}
# d256: the shipped non-overlapped winner; FA3's loop (overlap, O rescaled before P·V), which lost 555 vs 644 with
# the shared release; the same with the rescale after P·V; and that one under the persistent scheduler (with O
# rescaled before, persistent is pruned at d256: registers); last the shipped winner with ping-pong turns on its S
# issues (new: the before tree refuses it, so its row has an "after" only).
D256=2,bc=80,stages=2,setmaxnreg=1,pingpong=0,o_store=smem,min_blocks=1,scheduler=grid
ab d256 --shape b2-h8-n4096-d256-bf16-full \
  --config $W=$D256,overlap=0 --config $W=$D256,overlap=1,o_rescale=before --config $W=$D256,overlap=1,o_rescale=after \
  --config ${W}=${D256/scheduler=grid/scheduler=persistent},overlap=1,o_rescale=after \
  --config ${W}=${D256/pingpong=0/pingpong=1},overlap=0
# d128 (fp16, N1024, bf16, causal): the shipped config, then FlashAttention-3's d128 tile (128 × 176, two stages,
# ping-pong), which measured slower here with the shared release, and the shipped config with two stages.
P=setmaxnreg=1,overlap=1,min_blocks=1
ab d128-fp16 --shape b4-h16-n4096-d128-fp16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=128,stages=2,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=after
ab n1024 --shape b1-h64-n1024-d128-fp16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=128,stages=2,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=after
ab d128-bf16 --shape b4-h16-n4096-d128-bf16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=before \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=before
ab d128-causal --shape b4-h16-n4096-d128-fp16-causal \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=grid,o_rescale=before \
  --config $W=2,bc=128,stages=2,$P,pingpong=0,o_store=smem,scheduler=grid,o_rescale=before
# d64 (N4096, N512): the shipped configs, and each with two stages.
ab d64 --shape b4-h32-n4096-d64-fp16-full \
  --config $W=3,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after \
  --config $W=3,bc=128,stages=2,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after
ab n512 --shape b16-h16-n512-d64-fp16-full \
  --config $W=3,bc=128,stages=4,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=3,bc=128,stages=2,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after
# The idle-warpgroup skip alone: before = the tree with the separate K/V release only (SPLIT, commit 36a7d8e), on the
# shapes whose last query block leaves a warpgroup without rows (N512 d64 with Br 192; d64 N4096: 4096 = 21 × 192 + 64).
SPLIT=${SPLIT:-$PWD/.ab/36a7d8e/kernels}
if [ ! -d "$SPLIT/common" ]; then
  mkdir -p .ab/36a7d8e && git archive 36a7d8e kernels | tar -x -C .ab/36a7d8e || SPLIT=
fi
if [ -n "$SPLIT" ]; then
  AB[3]=$SPLIT
  ab idle --shape b16-h16-n512-d64-fp16-full --shape b4-h32-n4096-d64-fp16-full \
    --config $W=3,bc=128,stages=4,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
    --config $W=3,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after
else
  echo "no split-only tree (.ab/36a7d8e/kernels): idle A/B skipped" | tee -a "$OUT/summary.txt"
fi

# 3. Short shapes: how much of their time is the host's (eager against CUDA-graph replay; benchmarks/host_overhead.py).
if [ "$DRY" != 1 ]; then
  echo "== host overhead" | tee -a "$OUT/summary.txt"
  timeout 120 python3 benchmarks/host_overhead.py --out "$OUT/host" > "$OUT/host-overhead.log" 2>&1
  echo "rc=$?" >> "$OUT/summary.txt"
fi

for f in "$OUT"/ab-*/ab.md "$OUT"/host/host_overhead.md; do echo; echo "## $f"; cat "$f"; done | tee -a "$OUT/summary.txt"
