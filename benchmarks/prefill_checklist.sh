#!/usr/bin/env bash
# The prefill issue's GPU checklist on the GPU host (results under $OUT), in steps that each fit one run. The
# FlashAttention-4 wheels (../shared/fa4-wheels.sh) are too big for one run's carry: any step run with .fa4a
# carried first stages that part in /tmp/fa4, and `peers`, carrying .fa4b, must follow on the same host (it stays
# up about 30 s between runs).
#   bash benchmarks/prefill_checklist.sh vit-dram   ours alone under ncu on the ViT shape at N577 and N576 (three
#                                                   consumer warpgroups against two, persistent against grid): the
#                                                   check of the 1.5x DRAM reads' explanation (persistent CTAs held one
#                                                   query block each): with the rounds, cw3 persistent at N577 should
#                                                   read what cw2 and grid read
#   bash benchmarks/prefill_checklist.sh tables [BUDGET_S] [CAMPAIGN]   a campaign (default: the shapes real models
#                                                   run, studies/campaigns/h200-models.toml) merged into a copy of the
#                                                   shipped table, $OUT/h200.json (and /tmp/h200-merged.json, which
#                                                   `peers` on the same host then runs with), with its finalists merged
#                                                   into $OUT/finalists-h200.json and its storage, $OUT/tables.db
#   bash benchmarks/prefill_checklist.sh chunk-variants   the GQA chunk's grid Bc 192 loop variants and the Bc 128
#                                                   grid tile, searched in one study and exported into TABLE_GPU's
#                                                   table (/tmp/GPU-merged.json, which `stage` and `peers` then use)
#   bash benchmarks/prefill_checklist.sh stage      carry .fa4a: stage it in /tmp/fa4 and build the kernels the peers
#                                                   table's rows will run on this GPU (the short first run of the
#                                                   FlashAttention-4 pair; `peers` follows on the same host)
#   bash benchmarks/prefill_checklist.sh peers      carry .fa4b: install FlashAttention-4, then the peers table
#                                                   (benchmarks/peers_table.py, every row of the issue), then ours
#                                                   against FlashAttention-4 and cuDNN under ncu on the d128 row and
#                                                   the GQA causal row (NCU_SHAPES: other shape keys)
#   bash benchmarks/prefill_checklist.sh levers     the 2026-12-03 kernel changes (persistent rounds that turn, the
#                                                   softmax_reduce axis): the wgmma GPU matrix (tests/test_wgmma_gpu.py),
#                                                   then benchmarks/kernel_ab.py against main before both (9c18ec9,
#                                                   carried as .ab/9c18ec9): chain rows = the rounds alone, tree rows =
#                                                   both (docs/benchmarks.md, the two sections of that day)
#   bash benchmarks/prefill_checklist.sh stalls     where the d128 hot loop waits: per-instruction stall sampling
#                                                   (benchmarks/ncu_source.sh) of the chain and tree softmax on
#                                                   B4 H16 N4096 d128 fp16 and of its ping-pong row since the
#                                                   2026-12-03 retune, then (with .ab/9c18ec9 carried) the rounds' A/B again with six
#                                                   alternations and a grid config beside it as the control (the
#                                                   walk cannot move a grid kernel: its change is the method's noise)
#   bash benchmarks/prefill_checklist.sh exp2       the exp2_fma axis (every fourth exponential on the FMA pipe): the
#                                                   wgmma GPU matrix, then benchmarks/kernel_ab.py against main before
#                                                   the axis (c98d60e, carried as .ab/c98d60e, which ignores the macro:
#                                                   a `none` row's change is the method's noise, a `quarter` row's the
#                                                   axis) on the d128, d64, ViT and N512 rows with their shipped configs,
#                                                   and the d128 ping-pong config with softmax_reduce=tree too (within
#                                                   one tree, chain against tree is that axis under ping-pong)
#   bash benchmarks/prefill_checklist.sh sm80-regs [BUDGET_S]   the SM80-style kernel's loop holding only what it
#                                                   uses on every tile (FlashAttention-2's 128x64 d128 tile no longer
#                                                   spills): the mma_sync GPU matrix (tests/test_kernel_gpu.py), then
#                                                   benchmarks/kernel_ab.py against main before it (208bc9a, carried as
#                                                   .ab/208bc9a) with 128x64 and 128x32 on the four N4096 rows (SDPA
#                                                   flash timed beside them), then, given BUDGET_S, the mma-sync
#                                                   campaign (below), which enqueues 128x64
#   bash benchmarks/prefill_checklist.sh turns      ping-pong turns without the first S and the last P·V (FlashAttention-4's
#                                                   boundaries): the wgmma GPU matrix, then benchmarks/kernel_ab.py
#                                                   against 208bc9a (carried as .ab/208bc9a) with the d128 rows'
#                                                   ping-pong config, persistent and grid, and a pingpong=0 control
#   bash benchmarks/prefill_checklist.sh verify     the GPU matrices of both families (tests/test_kernel_gpu.py and
#                                                   tests/test_wgmma_gpu.py) in one pytest, while the kernels of `ab`
#                                                   build beside it (AB_CACHE, kept for `ab` if the host stays up)
#   bash benchmarks/prefill_checklist.sh ab [ROUNDS]   the A/Bs of sm80-regs and turns (sm80_ab, turns_ab) against
#                                                   208bc9a (.ab/208bc9a) in one run
#   bash benchmarks/prefill_checklist.sh mma-sync [BUDGET_S]   the SM80-style family's non-spilling best on the four
#                                                   N4096 rows against FlashAttention-2 (SDPA flash) timed beside each
#                                                   winner: studies/campaigns/h200-mma-sync.toml into $OUT/mma-sync.db
#                                                   (never merged into the shipped table), table in $OUT/mma-sync.md
#   bash benchmarks/prefill_checklist.sh fused      o_rescale=fused (O's rescale and P's conversion among the
#                                                   exponentials, FlashAttention-4's order): benchmarks/kernel_ab.py
#                                                   with --before kernels (both sides one tree: a row's before/after
#                                                   spread is the method's noise; kernel_ab checks every build against
#                                                   the fp32 reference before timing it) of the shipped d128 ping-pong
#                                                   and d64 three-warpgroup configs beside their fused twins on seven
#                                                   rows (docs/benchmarks.md, 2026-12-05 prediction)
#   bash benchmarks/prefill_checklist.sh fused-matrix   the wgmma GPU matrix's o_rescale=fused rows alone (44
#                                                   configs; the whole matrix with the A/B would not fit one run's
#                                                   600 s)
#   bash benchmarks/prefill_checklist.sh ptxas [ROUNDS]  the assembler alone: benchmarks/kernel_ab.py with --before
#                                                   kernels, the after side assembled by ptxas 13.5 (carried xz'd as
#                                                   .ptxas/ptxas.xz, from NVIDIA's nvidia-cuda-nvcc wheel:
#                                                   autotune/build/ptxas_swap.py), the shipped configs of the d128,
#                                                   DiT, Llama causal, N1024, GQA chunk and d64 rows
#   bash benchmarks/prefill_checklist.sh peel [ROUNDS]   the K/V loops peeled at the first masked tile (no per-tile
#                                                   mask test): benchmarks/kernel_ab.py against main before it (e9750af,
#                                                   carried as .ab/e9750af) with the shipped configs of the d128, DiT,
#                                                   Llama causal, N1024, GQA chunk, d64, N512 and ViT rows (every build
#                                                   checked against the fp32 reference first); then, in a second run,
#                                                   `verify-peel`: the whole wgmma GPU matrix (every loop changed)
#   bash benchmarks/prefill_checklist.sh l2-section [MB...]  the L2 section of the lpt/persistent tile order
#                                                   (traits.cuh kL2SectionBytes, 8 MB) at other sizes (default 32 16):
#                                                   kernel_ab with --before a copy of kernels/ with the constant changed
#                                                   ("after" = this checkout) on both causal d128 rows and two
#                                                   non-causal controls (same order at any size: the noise), P; then
#                                                   ncu's DRAM bytes of P on the Llama causal row, here and at the
#                                                   first size
#   bash benchmarks/prefill_checklist.sh verify-l2  the wgmma GPU matrix, then l2-section 32 with 6 rounds
#   bash benchmarks/prefill_checklist.sh verify-counter  the tile counter of causal persistent CTAs: the wgmma GPU
#                                                   matrix, tests/test_tile_counter_gpu.py, then ncu durations of P
#                                                   before (.ab/5bb3e5f-tree) and after on the causal rows
#   bash benchmarks/prefill_checklist.sh configs-ncu  ncu's duration of candidate configs on the GQA chunk and the
#                                                   Llama causal rows, and of the grid ping-pong config at Bc 176/192
#                                                   on two d128 non-causal rows (ours only)
#   bash benchmarks/prefill_checklist.sh chunk-retune  the GQA chunk row searched, seeded with Bc 192/176 grid and P,
#                                                   exported over the shipped table into /tmp/h200-merged.json
#                                                   (what `peers` then runs on this host) and $OUT/h200.json
#   bash benchmarks/prefill_checklist.sh tail       tail_split (the persistent last round cut along the keys, merged
#                                                   by flash_fwd_tail_combine): the wgmma GPU matrix's tail_split rows
#                                                   (each also on a cut shape), tests/test_tail_split_gpu.py and
#                                                   tests/test_tile_counter_gpu.py; TAIL_NCU=1 adds `tail-ncu`
#   bash benchmarks/prefill_checklist.sh tail-ncu   ncu's duration of P without and with the cut on the d128 and DiT
#                                                   rows (the tail combine is its own column)
#   bash benchmarks/prefill_checklist.sh tail-table  the peers rows the cut applies to searched with their shipped
#                                                   config and its tail_split twin enqueued (the search's retimes
#                                                   pick), then the GQA chunk as chunk-retune does, each exported over
#                                                   the shipped table into /tmp/h200-merged.json (what `peers` then
#                                                   runs on this host) and $OUT/h200.json
#   bash benchmarks/prefill_checklist.sh ncu        the ncu part alone (FlashAttention-4 installed by `peers` on
#                                                   this host)
# Each step has its own time limit so one slow step cannot take the others' share.
OUT=${OUT:-/tmp/prefill-out}
source "$(dirname "$0")/checklist_lib.sh"  # OUT made, cd to the checkout, step()
FA4_SITE=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages  # the wheel's .pth is not read from --target
VIT_CONFIG="wgmma:bc=128,stages=3,setmaxnreg=1,overlap=0,pingpong=0,o_store=smem,min_blocks=1,o_rescale=after"
VIT_CONFIG="$VIT_CONFIG,kv_splits=1,pack_gqa=0"
if [ -d .fa4a ]; then mkdir -p /tmp/fa4 && cp .fa4a/* /tmp/fa4/ && echo "== staged .fa4a in /tmp/fa4"; fi
wgmma_matrix() { gpu_matrix wgmma_tests 220 test_wgmma_gpu; }
export AB_CACHE=${AB_CACHE:-/tmp/autotune-ab-cache}
SM80=mma_sync:br=128,warps_m=4,warps_n=1,p_path=regs,smem_mode=dynamic,kv_buffering=separate,loader_warps=0
SM80=$SM80,min_blocks=1,q_in_regs=0,softmax_reduce=chain,o_rescale=on_growth,kv_splits=1
SM80_AB=(--shape b4-h16-n4096-d128-fp16-full --shape b4-h16-n4096-d128-fp16-causal --shape b4-h32-n4096-d64-fp16-full
  --shape b4-h16-n4096-d128-bf16-full --config "$SM80,bc=64" --config "$SM80,bc=32")
TW=wgmma:consumer_wgs=2,bc=128,setmaxnreg=1,overlap=1,o_store=smem,min_blocks=1,softmax_reduce=chain,exp2_fma=none
TW=$TW,kv_splits=1,pack_gqa=0
TP=$TW,stages=2,pingpong=1,o_rescale=before   # five d128 rows' shipped config, persistent
# the control: pingpong=0 takes no turns, so its change is the method's noise
TURNS_AB=(--shape b4-h16-n4096-d128-fp16-full --shape b1-h64-n1024-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full
  --shape b1-h32-kv8-n8192-d128-bf16-causal --config "$TP,scheduler=persistent" --config "$TP,scheduler=grid"
  --config "$TW,stages=2,pingpong=0,scheduler=persistent,o_rescale=after")
# the shipped table's prefill configs (studies/tuned/h200.json): SHIP_P five d128 rows', SHIP_L Llama causal's,
# SHIP_G the GQA chunk's, SHIP_T the d64 rows'
SW=wgmma:setmaxnreg=1,o_store=smem,min_blocks=1,softmax_reduce=chain,exp2_fma=none,kv_splits=1,pack_gqa=0
SHIP_P=$SW,consumer_wgs=2,bc=128,stages=2,overlap=1,pingpong=1,o_rescale=before,scheduler=persistent
SHIP_L=$SW,consumer_wgs=2,bc=128,stages=2,overlap=1,pingpong=1,o_rescale=before,scheduler=lpt
SHIP_G=$SW,consumer_wgs=2,bc=128,stages=3,overlap=1,pingpong=0,o_rescale=before,scheduler=grid
SHIP_T=$SW,consumer_wgs=3,bc=128,stages=3,overlap=0,pingpong=0,o_rescale=after,scheduler=persistent
# P's loop under the grid scheduler, Bc left to the step (Bc 176/192 are valid there, not persistent)
G2=$SW,consumer_wgs=2,stages=2,overlap=1,pingpong=1,o_rescale=before,scheduler=grid
ab() {  # ab NAME LIMIT_S ROUNDS ARGS...: benchmarks/kernel_ab.py against 208bc9a into $OUT/NAME
  local name=$1 limit=$2 rounds=$3; shift 3
  [ -d .ab/208bc9a/kernels ] || { echo "== $name: .ab/208bc9a/kernels not carried"; return 1; }
  AUTOTUNE_CACHE_DIR=$AB_CACHE TAIL=60 step "$name" "$limit" python3 -u benchmarks/kernel_ab.py \
    --before .ab/208bc9a/kernels --out "$OUT/$name" --rounds "$rounds" "$@"
}
use_merged_tables() {  # `tables` or a retune ran on this host: its tables are what would be shipped
  local merged gpu
  for merged in /tmp/*-merged.json; do
    [ -f "$merged" ] || continue
    gpu=$(basename "$merged" -merged.json)
    cp "$merged" "studies/tuned/$gpu.json" && echo "== on this host's $gpu table ($merged)"
  done
}
export_merged() {  # export_merged STEP DB GPU: DB's best rows merged over this host's copy of GPU's shipped table
  # (/tmp/GPU-merged.json, which `stage` and `peers` then run with; seeded from studies/tuned/GPU.json where the
  # host has none yet), brought back as $OUT/GPU.json
  local step_name=$1 db=$2 gpu=$3
  [ -f "/tmp/$gpu-merged.json" ] || [ ! -f "studies/tuned/$gpu.json" ] || cp "studies/tuned/$gpu.json" "/tmp/$gpu-merged.json"
  TAIL=3 step "$step_name" 30 python3 -m autotune.cli export "/tmp/$gpu-merged.json" --gpu "$gpu" --storage "$db" --merge
  rm -f "$OUT"/.autotune-*.lock  # the storage's lock files (a run brings back only a few files)
  cp "/tmp/$gpu-merged.json" "$OUT/$gpu.json"
}
chunk_search() {  # chunk_search TRIALS CONFIG...: the GQA chunk row (B1 H32/8 Nq512 Nk8192 d128 bf16) searched with
  # the configs enqueued after the family default, the finalists re-timed interleaved, into $OUT/chunk.db
  local trials=$1 enqueue=() key; shift
  for key in "$@"; do enqueue+=(--enqueue "$key"); done
  TAIL=12 step chunk_search 300 python3 -m autotune.cli search --seqlen 512 --seqlen-k 8192 --batch 1 --heads 32 \
    --kv-heads 8 --head-dim 128 --dtype bf16 --family wgmma --trials "$trials" --retime 4 \
    --storage "sqlite:///$OUT/chunk.db" "${enqueue[@]}"
}
case "${1:-}" in
  vit-dram)
    for n in 577 576; do
      TAIL=40 step "ncu_vit_n$n" 150 benchmarks/ncu_compare.sh "b64-h16-n$n-d64-bf16-full" "$OUT/ncu-vit-n$n" \
        --ours-only --config "$VIT_CONFIG,consumer_wgs=3,scheduler=persistent" \
        --config "$VIT_CONFIG,consumer_wgs=3,scheduler=grid" --config "$VIT_CONFIG,consumer_wgs=2,scheduler=persistent"
    done ;;
  tables)
    # the storage comes back in $OUT: the shipped finalists file (studies/finalists/h200.json) is written from it
    db=sqlite:///$OUT/tables.db
    TAIL=20 step tables_campaign $(( ${2:-170} + 30 )) python3 -m autotune.cli campaign "${3:-studies/campaigns/h200-models.toml}" \
      --budget-s "${2:-170}" --warm-from studies/tuned/h200.json --storage "$db" --markdown "$OUT/tables-campaign.md"
    cp studies/tuned/h200.json /tmp/h200-merged.json  # over the shipped table, not an earlier step's merge
    cp studies/finalists/h200.json "$OUT/finalists-h200.json"
    TAIL=3 step tables_finalists 30 python3 benchmarks/table_holds.py --write-finalists "$db" --merge \
      --finalists "$OUT/finalists-h200.json"
    export_merged tables_export "$db" h200 ;;
  stage)
    use_merged_tables
    [ -d .fa4a ] || echo "== stage: .fa4a not carried (FlashAttention-4 will not install in \`peers\`)"
    TAIL=3 step prebuild_peers 240 python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
import peers_table
peers_table.prebuild([peers_table.parse_shape(k) for k in peers_table.SHAPES])" ;;
  peers)
    use_merged_tables
    whl=/tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
    cat /tmp/fa4/cu13part.* .fa4b/cu13part.* > "$whl" \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl" .fa4b/*.whl \
      && echo "== FlashAttention-4 installed" || { echo "== FlashAttention-4 not installed (no .fa4a staged on this host: a step with .fa4a carried first)"; }
    PYTHONPATH=$FA4_SITE:$PWD TAIL=40 step peers 330 python3 -u benchmarks/peers_table.py --rep-ms 150 \
      --out "$OUT/peers"
    bash "$0" ncu ;;
  fused-matrix)
    MATRIX_SELECT=o_rescale=fused gpu_matrix wgmma_fused_tests 300 test_wgmma_gpu ;;
  ptxas)
    # here: mkdir -p .ptxas && unzip -p nvidia_cuda_nvcc-13.5.37-*.whl nvidia/cu13/bin/ptxas | xz -9 > .ptxas/ptxas.xz
    [ -f .ptxas/ptxas.xz ] || { echo "== ptxas_ab: .ptxas/ptxas.xz not carried"; exit 1; }
    mkdir -p /tmp/ptxas-swap && python3 -c "import lzma, shutil, sys
with lzma.open('.ptxas/ptxas.xz') as f, open('/tmp/ptxas-swap/ptxas', 'wb') as g: shutil.copyfileobj(f, g)" \
      && chmod +x /tmp/ptxas-swap/ptxas && /tmp/ptxas-swap/ptxas --version | tail -1
    TAIL=90 step ptxas_ab 360 python3 -u benchmarks/kernel_ab.py --before kernels --after-ptxas /tmp/ptxas-swap/ptxas \
      --out "$OUT/ab-ptxas" --rounds "${2:-3}" --shape b4-h16-n4096-d128-fp16-full \
      --shape b1-h24-n4608-d128-bf16-full --shape b1-h32-kv8-n8192-d128-bf16-causal \
      --shape b1-h64-n1024-d128-fp16-full --shape b1-h32-kv8-n512-k8192-d128-bf16-full \
      --shape b4-h32-n4096-d64-fp16-full --config "$SHIP_P" --config "$SHIP_L" --config "$SHIP_G" --config "$SHIP_T" ;;
  peel)
    #   mkdir -p .ab/e9750af && git archive e9750af kernels | tar -x -C .ab/e9750af   # main before the peel
    [ -d .ab/e9750af/kernels ] || { echo "== peel_ab: .ab/e9750af/kernels not carried"; exit 1; }
    TAIL=90 step peel_ab 420 python3 -u benchmarks/kernel_ab.py --before .ab/e9750af/kernels --out "$OUT/ab-peel" \
      --rounds "${2:-3}" --shape b4-h16-n4096-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full \
      --shape b1-h32-kv8-n8192-d128-bf16-causal --shape b1-h64-n1024-d128-fp16-full \
      --shape b1-h32-kv8-n512-k8192-d128-bf16-full --shape b4-h32-n4096-d64-fp16-full \
      --shape b16-h16-n512-d64-fp16-full --shape b64-h16-n577-d64-bf16-full \
      --config "$SHIP_P" --config "$SHIP_L" --config "$SHIP_G" --config "$SHIP_T" --config "$SHIP_T,stages=4" ;;
  verify-peel)
    wgmma_matrix ;;
  l2-section)
    # sections of other sizes against this checkout's (traits.cuh kL2SectionBytes): "before" = a copy of kernels/
    # with the constant set to each size named (default 32 16), "after" = this checkout; then ncu's DRAM bytes of P
    # on the Llama causal row, this checkout's section against the first size named
    sizes=("${@:2}"); [ ${#sizes[@]} -gt 0 ] || sizes=(32 16)
    set_section() {  # set_section MB DIR: DIR/kernels/sm90/traits.cuh with kL2SectionBytes = MB << 20
      sed -i -E "s/kL2SectionBytes = [0-9]+ll << 20;/kL2SectionBytes = ${1}ll << 20;/" "$2/kernels/sm90/traits.cuh"
      grep -q "kL2SectionBytes = ${1}ll << 20;" "$2/kernels/sm90/traits.cuh" || { echo "== l2-section: $2 not edited"; exit 1; }
    }
    for m in "${sizes[@]}"; do
      rm -rf "/tmp/l2s$m" && mkdir -p "/tmp/l2s$m" && cp -r kernels "/tmp/l2s$m/" && set_section "$m" "/tmp/l2s$m"
      # the non-causal rows are the method's noise: their order does not depend on the section
      TAIL=30 step "l2s${m}_ab" 200 python3 -u benchmarks/kernel_ab.py --before "/tmp/l2s$m/kernels" --out "$OUT/ab-l2s$m" \
        --rounds "${L2_ROUNDS:-3}" --shape b4-h16-n4096-d128-fp16-causal --shape b1-h32-kv8-n8192-d128-bf16-causal \
        --shape b4-h16-n4096-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full --config "$SHIP_P"
    done
    TAIL=25 step ncu_l2s_here 120 benchmarks/ncu_compare.sh b1-h32-kv8-n8192-d128-bf16-causal "$OUT/ncu-l2s-here" \
      --ours-only --config "$SHIP_P"
    rm -rf /tmp/l2co && cp -r "$PWD" /tmp/l2co && set_section "${sizes[0]}" /tmp/l2co
    PYTHONPATH=/tmp/site:/tmp/l2co TAIL=25 step "ncu_l2s${sizes[0]}" 120 /tmp/l2co/benchmarks/ncu_compare.sh \
      b1-h32-kv8-n8192-d128-bf16-causal "$OUT/ncu-l2s${sizes[0]}" --ours-only --config "$SHIP_P" ;;
  configs-ncu)
    # candidate configs of the two rows still behind FlashAttention-4 after the 8 MB section, by ncu's duration (one
    # launch each, caches flushed between: steadier than kernel_ab's timing on one H100, +-3 %): the GQA chunk (a
    # single wave of 128 tiles) and the Llama causal prefill; FlashAttention-4 runs both with packed GQA heads
    TAIL=30 step ncu_chunk_configs 150 benchmarks/ncu_compare.sh b1-h32-kv8-n512-k8192-d128-bf16-full \
      "$OUT/ncu-chunk-configs" --ours-only --configs-only --config "$SHIP_P" --config "$G2,bc=128" \
      --config "$G2,bc=128,pack_gqa=1" --config "$SW,consumer_wgs=2,bc=128,stages=3,overlap=1,pingpong=1,o_rescale=before,scheduler=grid" \
      --config "$G2,bc=176" --config "$G2,bc=192" --config "$SHIP_G"
    TAIL=30 step ncu_llama_configs 150 benchmarks/ncu_compare.sh b1-h32-kv8-n8192-d128-bf16-causal \
      "$OUT/ncu-llama-configs" --ours-only --configs-only --config "$SHIP_P" --config "$SHIP_L" \
      --config "$G2,bc=128" --config "$G2,bc=128,pack_gqa=1" --config "${SHIP_L/bc=128/bc=176}"
    for shape in b4-h16-n4096-d128-fp16-full b1-h24-n4608-d128-bf16-full; do  # many tiles per CTA: grid at Bc 176/192?
      TAIL=12 step "ncu_${shape}_configs" 120 benchmarks/ncu_compare.sh "$shape" "$OUT/ncu-$shape-configs" --ours-only \
        --configs-only --config "$SHIP_P" --config "$G2,bc=192" --config "$G2,bc=176"
    done ;;
  chunk-retune)
    # the GQA chunk row searched again, seeded with the grid ping-pong config at Bc 192 and 176 (ncu on the H100,
    # 2026-12-06: 99.1 and 99.4 us against P's 100.8; Bc above 128 is not valid with P's persistent loop) and P;
    # exported over this host's copy of the shipped table into /tmp/h200-merged.json, which `peers` then runs
    chunk_search 6 "$G2,bc=192" "$G2,bc=176" "$SHIP_P"
    export_merged chunk_export "sqlite:///$OUT/chunk.db" h200 ;;
  tail)
    # the tail cut (2026-12-06): its matrix rows (the ids of the ladder's tail configs end exp2_fma, tail_split,
    # kv_splits, pack_gqa = none-1-1-0; no other config's do), its own test and the counter's (whose CUDA-graph part
    # has not run yet), then ncu: P without and with the cut, alternated, on the two rows the model gives most
    MATRIX_SELECT=tail_split=True MATRIX_K=none-1-1-0 gpu_matrix wgmma_tail_tests 240 test_wgmma_gpu
    TAIL=8 step tail_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tail_split_gpu.py \
      tests/test_tile_counter_gpu.py
    [ -n "${TAIL_NCU:-}" ] && bash "$0" tail-ncu ;;
  tail-ncu)
    for shape in b4-h16-n4096-d128-fp16-full b1-h24-n4608-d128-bf16-full; do
      TAIL=14 step "ncu_tail_$shape" 150 benchmarks/ncu_compare.sh "$shape" "$OUT/ncu-tail-$shape" --ours-only \
        --configs-only --config "$SHIP_P" --config "$SHIP_P,tail_split=1" --config "$SHIP_P" --config "$SHIP_P,tail_split=1"
    done ;;
  tail-cost)
    # the cut's gain and the combine's cost in the stream (benchmarks/tail_combine_cost.py): whole, cut alone, cut +
    # combine, interleaved, on the rows the plan cuts and the ViT with a cut forced (what TAIL_COMBINE_COST models)
    TAIL=30 step tail_cost 300 python3 -u benchmarks/tail_combine_cost.py --out "$OUT/tail-cost" ;;
  tail-table)
    # the rows whose shipped config is persistent and non-causal and whose last round the plan cuts (the N1024, N512
    # and ViT rows' is not: their search would only re-time the shipped config), each searched with that config and its
    # tail_split twin enqueued: the search's retimes alternate them and the export keeps the faster; then the GQA
    # chunk seeded as `chunk-retune` is. Exported after each search, so a run cut short keeps what it finished.
    # TAIL_ROWS=K: the first K rows only; TAIL_EXPORT=0: time them, export nothing; TABLE_GPU=h100: export into
    # that GPU's table (studies/tuned/h100.json, new if absent; `peers` then runs with it) instead of the H200's
    db=sqlite:///$OUT/tail.db gpu=${TABLE_GPU:-h200}
    P2="$SHIP_P,tail_split=1|$SHIP_P" T2="$SHIP_T,tail_split=1|$SHIP_T"
    # B H N Nk D dtype trials configs; trials: the family's default (a fresh study tries it first), then the configs
    for row in "4 16 4096 4096 128 fp16 3 $P2" "1 24 4608 4608 128 bf16 3 $P2" "4 16 4096 4096 128 bf16 3 $P2" \
               "4 32 4096 4096 64 fp16 3 $T2" "1 32 512 8192 128 bf16 4 $G2,bc=192|$G2,bc=176|$SHIP_P"; do
      rows_left=$(( ${rows_left:-${TAIL_ROWS:-99}} - 1 )); [ "$rows_left" -lt 0 ] && break
      read -r b h n nk d dt trials configs <<< "$row"
      kv=$h; [ "$nk" = 8192 ] && kv=8
      enqueue=(); IFS='|' read -ra keys <<< "$configs"; for key in "${keys[@]}"; do enqueue+=(--enqueue "$key"); done
      TAIL=4 step "tail_search_b$b-h$h-n$n-k$nk-d$d-$dt" 200 python3 -m autotune.cli search --seqlen "$n" \
        --seqlen-k "$nk" --batch "$b" --heads "$h" --kv-heads "$kv" --head-dim "$d" --dtype "$dt" --family wgmma \
        --trials "$trials" --retime 4 --storage "$db" "${enqueue[@]}"
      [ "${TAIL_EXPORT:-1}" = 0 ] && continue
      export_merged "tail_export_$n-$d-$dt" "$db" "$gpu"
    done ;;
  chunk-variants)
    # the GQA chunk (B1 H32/8 Nq512 Nk8192 d128 bf16), whose grid Bc 192 config ran 0.5 % behind FlashAttention-4 on
    # the H100 (2026-12-06): that config's loop variants not yet timed on that tile (the 2026-12-06 retune tried
    # them on persistent Bc 128 only), and the Bc 128 grid tile FlashAttention-4 runs (no partial last key tile:
    # 8192 = 42 x 192 + 128), searched in one study, the finalists re-timed interleaved; exported like tail-table
    # (TABLE_GPU, default h200; TAIL_EXPORT=0: time them, export nothing)
    chunk_search 9 "$G2,bc=192" "$G2,bc=192,softmax_reduce=tree" "$G2,bc=192,o_rescale=fused" \
      "$G2,bc=192,o_rescale=after" "$G2,bc=192,o_store=direct" "$G2,bc=176,softmax_reduce=tree" "$G2,bc=128" \
      "$G2,bc=128,stages=3"
    [ "${TAIL_EXPORT:-1}" = 0 ] || export_merged chunk_export "sqlite:///$OUT/chunk.db" "${TABLE_GPU:-h200}" ;;
  verify-counter)
    # causal persistent CTAs taking tiles from a counter: the wgmma GPU matrix, the counter's own test, then ncu's
    # duration of the shipped P config on both causal d128 rows and a non-causal control, this checkout against
    # main before the change (the whole tree: its loader and parameter block differ), carried as .ab/5bb3e5f-tree:
    #   mkdir -p .ab/5bb3e5f-tree && git archive 5bb3e5f kernels autotune space benchmarks studies pyproject.toml | tar -x -C .ab/5bb3e5f-tree
    wgmma_matrix
    TAIL=6 step counter_test 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tile_counter_gpu.py
    [ -d .ab/5bb3e5f-tree/kernels ] || { echo "== counter ncu: .ab/5bb3e5f-tree not carried"; exit 1; }
    for shape in b4-h16-n4096-d128-fp16-causal b1-h32-kv8-n8192-d128-bf16-causal b4-h16-n4096-d128-fp16-full; do
      for side in before1 after1 before2 after2; do  # alternated, two launches each
        tree=$PWD; [ "${side%?}" = before ] && tree=$PWD/.ab/5bb3e5f-tree
        (cd "$tree" && PYTHONPATH=/tmp/site:$tree TAIL=3 OUT=$OUT step "ncu_${side}_$shape" 120 \
          benchmarks/ncu_compare.sh "$shape" "$OUT/ncu-$side-$shape" --ours-only --configs-only \
          --config "$SHIP_P" --config "$SHIP_P")
      done
    done ;;
  verify-l2)
    # the 8 MB section (2026-12-06): the whole wgmma GPU matrix (every persistent and lpt causal order moved), then
    # 6 rounds against the 32 MB it replaced
    wgmma_matrix
    L2_ROUNDS=6 bash "$0" l2-section 32 ;;
  fused)
    W=wgmma:setmaxnreg=1,o_store=smem,min_blocks=1,exp2_fma=none,kv_splits=1,pack_gqa=0
    P=$W,consumer_wgs=2,bc=128,stages=2,overlap=1,pingpong=1,scheduler=persistent  # five d128 rows' (or=before)
    T=$W,consumer_wgs=3,bc=128,stages=3,overlap=0,pingpong=0,scheduler=persistent  # the d64 rows' (or=after)
    # the ping-pong config's fused twin also with the four-partial reductions: its softmax block issues in 748
    # cycles against chain's 799 (with o_rescale=before, tree lost 5.6 % on d128, 2026-12-04)
    TAIL=90 step fused_ab 420 python3 -u benchmarks/kernel_ab.py --before kernels --out "$OUT/ab-fused" --rounds 3 \
      --shape b4-h16-n4096-d128-fp16-full --shape b1-h64-n1024-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full \
      --shape b1-h32-kv8-n8192-d128-bf16-causal --shape b4-h32-n4096-d64-fp16-full --shape b16-h16-n512-d64-fp16-full \
      --shape b64-h16-n577-d64-bf16-full --config "$P,o_rescale=before,softmax_reduce=chain" \
      --config "$P,o_rescale=fused,softmax_reduce=chain" --config "$P,o_rescale=fused,softmax_reduce=tree" \
      --config "$T,o_rescale=after,softmax_reduce=chain" --config "$T,o_rescale=fused,softmax_reduce=chain" ;;
  levers)
    wgmma_matrix
    # before = main before both changes, carried as .ab/9c18ec9 (git-ignored; the host has no git history):
    #   mkdir -p .ab/9c18ec9 && git archive 9c18ec9 kernels | tar -x -C .ab/9c18ec9
    [ -d .ab/9c18ec9/kernels ] || { echo "== levers_ab: .ab/9c18ec9/kernels not carried"; exit 1; }
    W=wgmma:setmaxnreg=1,o_store=smem,min_blocks=1,scheduler=persistent,o_rescale=after,kv_splits=1,pack_gqa=0
    A=$W,consumer_wgs=2,bc=128,stages=2,overlap=1,pingpong=0   # d128 N1024's shipped config
    B=$W,consumer_wgs=3,bc=128,stages=4,overlap=0,pingpong=0   # the ViT's 50-trial winner (d64 only)
    TAIL=80 step levers_ab 300 python3 -u benchmarks/kernel_ab.py --before .ab/9c18ec9/kernels --out "$OUT/ab-levers" \
      --shape b64-h16-n577-d64-bf16-full --shape b16-h16-n512-d64-fp16-full --shape b4-h32-n4096-d64-fp16-full \
      --shape b1-h64-n1024-d128-fp16-full --shape b4-h16-n4096-d128-fp16-full \
      --config "$A,softmax_reduce=chain" --config "$A,softmax_reduce=tree" \
      --config "$B,softmax_reduce=chain" --config "$B,softmax_reduce=tree" ;;
  stalls)
    W=wgmma:consumer_wgs=2,bc=128,setmaxnreg=1,overlap=1,o_store=smem,min_blocks=1,kv_splits=1,pack_gqa=0
    A=$W,stages=2,pingpong=0,scheduler=persistent,o_rescale=after        # the d128 N4096 fp16 row's
    P=$W,stages=2,pingpong=1,scheduler=persistent,o_rescale=before,softmax_reduce=chain  # its row since the retune
    for label in chain tree pingpong; do
      case $label in pingpong) cfg=$P ;; *) cfg="$A,softmax_reduce=$label" ;; esac
      NCU_CONFIG="$cfg" NCU_LABEL=$label TAIL=3 step "ncu_source_$label" 150 \
        benchmarks/ncu_source.sh "$OUT/stalls" b4-h16-n4096-d128-fp16-full
    done
    rm -f "$OUT"/stalls/*.ncu-rep
    [ -d .ab/9c18ec9/kernels ] || { echo "== walk_ab: .ab/9c18ec9/kernels not carried"; exit 1; }
    TAIL=30 step walk_ab 300 python3 -u benchmarks/kernel_ab.py --before .ab/9c18ec9/kernels --out "$OUT/ab-walk" \
      --rounds 6 --shape b4-h16-n4096-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full \
      --config "$A,softmax_reduce=chain" --config "$P" \
      --config "$W,stages=3,pingpong=0,scheduler=grid,o_rescale=before,softmax_reduce=chain" ;;
  exp2)
    wgmma_matrix
    #   mkdir -p .ab/c98d60e && git archive c98d60e kernels | tar -x -C .ab/c98d60e
    [ -d .ab/c98d60e/kernels ] || { echo "== exp2_ab: .ab/c98d60e/kernels not carried"; exit 1; }
    W=wgmma:setmaxnreg=1,overlap=1,o_store=smem,min_blocks=1,kv_splits=1,pack_gqa=0
    P=$W,consumer_wgs=2,bc=128,stages=2,pingpong=1,scheduler=persistent,o_rescale=before  # the d128 rows' (2026-12-03)
    T=wgmma:consumer_wgs=3,bc=128,setmaxnreg=1,overlap=0,pingpong=0,o_store=smem,min_blocks=1,scheduler=persistent
    T=$T,o_rescale=after,softmax_reduce=chain,kv_splits=1,pack_gqa=0   # the d64 rows' and the ViT's, stages 3 and 4
    # the ping-pong config also with the four-partial row reductions (softmax_reduce=tree, FlashAttention-4's row
    # max): measured only on non-ping-pong configs so far, where the other consumer warp of a sub-partition hides
    # the max chain's latency; under ping-pong a warp's softmax runs alone on its sub-partition
    TAIL=60 step exp2_ab 420 python3 -u benchmarks/kernel_ab.py --before .ab/c98d60e/kernels --out "$OUT/ab-exp2" \
      --rounds 4 --shape b4-h16-n4096-d128-fp16-full --shape b1-h24-n4608-d128-bf16-full \
      --shape b4-h32-n4096-d64-fp16-full --shape b16-h16-n512-d64-fp16-full --shape b64-h16-n577-d64-bf16-full \
      --config "$P,softmax_reduce=chain,exp2_fma=none" --config "$P,softmax_reduce=chain,exp2_fma=quarter" \
      --config "$P,softmax_reduce=tree,exp2_fma=none" --config "$P,softmax_reduce=tree,exp2_fma=quarter" \
      --config "$T,stages=3,exp2_fma=none" --config "$T,stages=3,exp2_fma=quarter" \
      --config "$T,stages=4,exp2_fma=none" --config "$T,stages=4,exp2_fma=quarter" ;;
  sm80-regs)
    gpu_matrix mma_sync_tests 240 test_kernel_gpu
    #   mkdir -p .ab/208bc9a && git archive 208bc9a kernels | tar -x -C .ab/208bc9a   # main before the change
    ab sm80_ab 300 3 "${SM80_AB[@]}"
    if [ -n "${2:-}" ]; then bash "$0" mma-sync "$2"; fi ;;
  turns)
    wgmma_matrix
    ab turns_ab 330 3 "${TURNS_AB[@]}" ;;
  verify)
    ( for a in SM80_AB TURNS_AB; do declare -n args=$a
        AUTOTUNE_CACHE_DIR=$AB_CACHE python3 benchmarks/kernel_ab.py --before .ab/208bc9a/kernels --build-only \
          --arch sm_90 --out /tmp/ab-build "${args[@]}"; done > "$OUT/ab_prebuild.log" 2>&1 ) &
    gpu_matrix matrices 400 test_kernel_gpu test_wgmma_gpu
    wait; grep -h "kernels from\|→" "$OUT/ab_prebuild.log" | tail -60 ;;
  ab)
    ab sm80_ab 170 "${2:-3}" "${SM80_AB[@]}"
    ab turns_ab 200 "${2:-3}" "${TURNS_AB[@]}" ;;
  mma-sync)
    TAIL=12 step mma_sync_campaign $(( ${2:-240} + 30 )) python3 -m autotune.cli campaign studies/campaigns/h200-mma-sync.toml \
      --budget-s "${2:-240}" --storage "sqlite:///$OUT/mma-sync.db" --versus sdpa_flash --markdown "$OUT/mma-sync.md"
    rm -f "$OUT"/.autotune-*.lock ;;
  ncu)
    for shape in ${NCU_SHAPES:-b4-h16-n4096-d128-fp16-full b1-h32-kv8-n8192-d128-bf16-causal b1-h32-kv8-n512-k8192-d128-bf16-full}; do
      PYTHONPATH=$FA4_SITE:$PWD TAIL=40 step "ncu_$shape" 120 benchmarks/ncu_compare.sh "$shape" "$OUT/ncu-$shape" \
        --peers fa4,cudnn
    done ;;
  *) echo "usage: $0 vit-dram|tables [BUDGET_S] [CAMPAIGN]|stage|peers|ncu|levers|stalls|exp2|sm80-regs [BUDGET_S]|turns|verify|ab [ROUNDS]|mma-sync [BUDGET_S]|fused|fused-matrix|ptxas [ROUNDS]|peel [ROUNDS]|verify-peel|l2-section [MB...]|verify-l2|configs-ncu|chunk-retune|verify-counter" >&2; exit 2 ;;
esac
