#!/usr/bin/env bash
# The wgmma levers of kernel round 3, A/B on one H200 (docs/benchmarks.md, the "Lever" sections of round 3):
#   split   K and V of a ring slot released separately (K as soon as S = Q·Kᵀ has read it)       commit 36a7d8e
#   idle    a consumer warpgroup with no query row below seqlen_q only walks the ring               commit 4ed78e6
#   pp      ping-pong turns in the plain (non-overlapped) loop, pingpong=1 with overlap=0               3cd99cc
#           (the first GPU run, /work/prompts/ab1, measured main against 3cd99cc; +0.4 %: taken out again at HEAD)
#   qslots  persistent CTAs get a second Q slot where it fits (next tile's Q loads under this one)  a916641
#   joint   the split release only in the two-stage overlapped loop (the round-1 A/B: it gains 26-61 % there and
#           lost 1-4 % on 3-stage configs); d256's default overlaps                                 HEAD
# 1. the GPU correctness matrix, all of it (capped at TEST_S seconds);
# 2. A/Bs (benchmarks/kernel_ab.py, same configs built from two kernel trees, timed alternately in one process):
#    main (14c1437) against this tree on the peer shapes, shipped configs first, then the configs the changes should
#    unlock; then round 2 alone (3cd99cc against this tree);
# 3. with HOST=1, eager against CUDA-graph timing of the short shapes (benchmarks/host_overhead.py).
# Logs and tables under $OUT (default ./ab-out); the tables are printed at the end (and in $OUT/summary.txt).
#
#   benchmarks/wgmma_levers_ab.sh            # before trees: .ab/<rev>/kernels, else `git archive <rev> kernels`
# On a GPU host without the git history, bring the before trees along (they are git-ignored): in /work/wt-kernel,
#   for r in 14c1437 3cd99cc; do mkdir -p .ab/$r && git archive $r kernels | tar -x -C .ab/$r; done
# then run with carry [".ab"] and OUT=$OUT (the device's output folder).
#   DRY=1 benchmarks/wgmma_levers_ab.sh      # no GPU: skip 1 and 3, build both sides of every A/B for sm_90
#
# Budget: ~7 minutes (tests ≤ TEST_S, A/Bs ~4 min).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/ab-out}
TEST_S=${TEST_S:-200}
DRY=${DRY:-0}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export AUTOTUNE_CACHE_DIR=${AUTOTUNE_CACHE_DIR:-$OUT/.kcache}
export AUTOTUNE_TEST_CACHE_DIR=$AUTOTUNE_CACHE_DIR
: > "$OUT/summary.txt"
say() { echo "$@" | tee -a "$OUT/summary.txt"; }

# A copy of the kernel tree of <rev>, patched to accept this checkout's layout: both sides are built with this
# checkout's space/, whose dynamic smem (more mbarriers, a second Q slot) exceeds what an older traits.cuh computes,
# and its layout_smem_dynamic static_assert would refuse the build. The copy only requires the launch to give at
# least what it uses (the extra bytes sit unused), so the two sides run with the same smem and differ in code only.
tree() {
  local rev=$1 src=$PWD/.ab/$1/kernels dst=$OUT/tree-$1
  if [ ! -d "$src/common" ]; then
    mkdir -p ".ab/$rev" && git archive "$rev" kernels | tar -x -C ".ab/$rev" 2>/dev/null || {
      echo "wgmma_levers_ab: no .ab/$rev/kernels and git archive $rev failed" >&2; return 1; }
  fi
  rm -rf "$dst" && cp -r "$src" "$dst"
  sed -i 's/static_assert(AT_EXPECT_SMEM_DYNAMIC == kSmemDynamic,/static_assert(AT_EXPECT_SMEM_DYNAMIC >= kSmemDynamic,/' \
    "$dst/sm90/traits.cuh"
  grep -q "AT_EXPECT_SMEM_DYNAMIC >= kSmemDynamic" "$dst/sm90/traits.cuh" || {
    echo "wgmma_levers_ab: $dst/sm90/traits.cuh: the layout_smem_dynamic assert was not found" >&2; return 1; }
  echo "$dst"
}
MAIN=$(tree 14c1437) || exit 2
PP=$(tree 3cd99cc) || exit 2
say "trees: main $MAIN, pp (first GPU run) $PP; after: $PWD/kernels"

# 1. correctness: d256 (every config of the matrix: grid/lpt/persistent, with and without overlap and ping-pong), the
#    two-stage overlapped ladder entries of two problems, the 3-warpgroup ones of d64 fp16 (idle warpgroups: cases
#    n1, n17, n1000, q100-k300, q300-k100; persistent ones have two Q slots), and pingpong=1, overlap=0 on two more.
#    Round 2 changes every config (the release mode follows overlap and stages, the Q slots the scheduler), so the
#    whole matrix runs (the 440-test subset of the first run took 39 s); K narrows it if the cap is too short.
K=${K:-gpu}
if [ "$DRY" != 1 ]; then
  say "== pytest -m gpu tests/test_wgmma_gpu.py -k '$K' (cap ${TEST_S}s)"
  timeout "$TEST_S" python3 -m pytest -q -n 4 -m gpu tests/test_wgmma_gpu.py -k "$K" -p no:cacheprovider \
    > "$OUT/gpu-tests.log" 2>&1
  say "pytest rc=$? (124 = cut off by the cap; the log says how far it got)"
  tail -n 15 "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"
fi

# 2. A/B: ab NAME BEFORE-TREE kernel_ab-arguments...
ab() {
  local name=$1 before=$2; shift 2
  local cmd=(python3 benchmarks/kernel_ab.py --before "$before" --rounds 2 --out "$OUT/ab-$name")
  [ "$DRY" = 1 ] && cmd+=(--build-only --arch sm_90)
  say "== A/B $name (before: $before)"
  "${cmd[@]}" "$@" > "$OUT/ab-$name.log" 2>&1
  say "rc=$?"
}
W=wgmma:consumer_wgs
P=setmaxnreg=1,overlap=1,min_blocks=1
# d256 bf16: the shipped non-overlapped winner; FlashAttention-3's loop (overlap, O rescaled before P·V; 555 vs 644
# with the shared release); the same with the rescale after P·V (the default now).
D256=2,bc=80,stages=2,setmaxnreg=1,pingpong=0,o_store=smem,min_blocks=1,scheduler=grid
ab d256 "$MAIN" --shape b2-h8-n4096-d256-bf16-full \
  --config $W=$D256,overlap=0 --config $W=$D256,overlap=1,o_rescale=before --config $W=$D256,overlap=1,o_rescale=after
# N512 d64 and N1024 d128: shipped, and two-stage variants (two Q slots fit only there at N1024).
ab n512 "$MAIN" --shape b16-h16-n512-d64-fp16-full \
  --config $W=3,bc=128,stages=4,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=3,bc=128,stages=2,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after
ab n1024 "$MAIN" --shape b1-h64-n1024-d128-fp16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=128,stages=2,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=after
# Round 2 alone (second Q slot, joint release outside two-stage overlap) against the tree of the first GPU run: the
# persistent d64 configs (two Q slots) and the shipped causal and bf16 d128 configs (3 stages: joint release again).
ab round2 "$PP" --shape b16-h16-n512-d64-fp16-full --shape b4-h32-n4096-d64-fp16-full \
  --config $W=3,bc=128,stages=4,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=3,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after
ab round2-d128 "$PP" --shape b4-h16-n4096-d128-fp16-causal --shape b4-h16-n4096-d128-bf16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=grid,o_rescale=before \
  --config $W=2,bc=128,stages=3,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=before
# d128 N4096 fp16 and bf16: shipped, FlashAttention-3's d128 tile (128 × 176, two stages, ping-pong; it paid the
# shared release's round trip), and the shipped fp16 config with two stages (and so two Q slots).
ab d128 "$MAIN" --shape b4-h16-n4096-d128-fp16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=128,stages=2,$P,pingpong=0,o_store=direct,scheduler=persistent,o_rescale=after \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=after
ab d128-bf16 "$MAIN" --shape b4-h16-n4096-d128-bf16-full \
  --config $W=2,bc=128,stages=3,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=before \
  --config $W=2,bc=176,stages=2,$P,pingpong=1,o_store=smem,scheduler=grid,o_rescale=before
# d64 N4096 and causal d128: shipped only (the totals of all four changes there).
ab d64 "$MAIN" --shape b4-h32-n4096-d64-fp16-full \
  --config $W=3,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=persistent,o_rescale=after
ab causal "$MAIN" --shape b4-h16-n4096-d128-fp16-causal \
  --config $W=2,bc=128,stages=3,$P,pingpong=0,o_store=smem,scheduler=grid,o_rescale=before

# 3. Short shapes: how much of their time is the host's (the first run answered: none, eager = graph; HOST=1 reruns).
if [ "$DRY" != 1 ] && [ "${HOST:-0}" = 1 ]; then
  say "== host overhead"
  timeout 60 python3 benchmarks/host_overhead.py --out "$OUT/host" > "$OUT/host-overhead.log" 2>&1
  say "rc=$?"
fi

for f in "$OUT"/ab-*/ab.md "$OUT"/host/host_overhead.md; do
  [ -f "$f" ] && { echo; echo "## $f"; cat "$f"; }
done | tee -a "$OUT/summary.txt"
[ "$DRY" = 1 ] && grep -h " → " "$OUT"/ab-*.log | tee -a "$OUT/summary.txt"
exit 0
