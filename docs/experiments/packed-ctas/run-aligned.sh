#!/bin/bash
# Measures s31's change (dynamic shared memory 128-byte aligned) on the GPU,
# two `device` calls from the repository root, each under the 10-minute limit:
#   PART=perf   bash .gpu/run-aligned.sh   (about 6 minutes)
#   PART=checks bash .gpu/run-aligned.sh   (about 4 minutes)
# Carry .gpu/bin/decode-attn (main, built by ../shared/tools/gpu-stage --bin
# decode-attn -- -p decode-attn-cuda -p decode-attn-cli --release),
# .gpu/bin/decode-attn-v30 (the build before the change: kernels as ad96391,
# e.g. s30's staged .gpu/bin/decode-attn, built at 73e13ec), .gpu/tests
# (PART=checks) and this script, copied to .gpu/run-aligned.sh.
# Results: $OUT/r-$PART.tgz.
# What to read (PART=perf), µs per call, same plans:
#   eq-*     the grid at B = 4, 16, 64: v30 off (the plain grid, as
#            shipped), new off (must equal it: the plain code is unchanged),
#            new always (packed launches: predicted within their later
#            pairs' cost of off, about 5% at 70B B=64 s=4096), v30 always
#            (s31 call 2: 10-16% slower on long shapes), new batch (the
#            batch rule at the planned lengths; s31 call 2: 16-31% slower)
#            e2-aligned, e6-aligned (docs/experiments/packed-ctas/e2 and e6
#            rebuilt on the aligned kernels: packed without later pairs,
#            equal lengths only; every pair through one inlined loop),
#            carried too if the call has room
#   graph-*  ragged batches replayed in a graph planned for 65536 tokens,
#            batch rule off against auto (s28: 1.6-4.2x faster on a few long
#            among short, 5-29% slower on spread lengths)
#   stream-* the stream kernel (DECODE_ATTN_CUDA_KERNEL=stream), 8B, v30
#            against new: its rings moved to a 128-byte boundary too
#   own-*    the same batches planned for themselves, packing off, auto
#            (s27: only the 70B 32k among 63 of 512 packs) and always
#            (whether a lower PACK_MIN_EMPTY_PER_ACTIVE would now pay) and
#            plan (planned as if empty CTAs cost nothing, every plan with
#            one packed; s27's experiment, 9 of 12 slower before the fix)
cd .gpu
PART=${PART:-perf}
R=$OUT/r-$PART; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" >> $R/progress.txt; }
GRID="--batch 4,16,64 --seq-len 1024,4096,16384"
LENS=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
case "$PART" in
perf)
  for m in llama3-70b-tp8 llama3-8b; do
    for run in "v30-off bin/decode-attn-v30 DECODE_ATTN_CUDA_PACKED=off" \
               "new-off bin/decode-attn DECODE_ATTN_CUDA_PACKED=off" \
               "new-always bin/decode-attn DECODE_ATTN_CUDA_PACKED=always" \
               "v30-always bin/decode-attn-v30 DECODE_ATTN_CUDA_PACKED=always" \
               "new-batch bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto" \
               "e2-aligned bin/decode-attn-e2-aligned DECODE_ATTN_CUDA_PACKED=always" \
               "e6-aligned bin/decode-attn-e6-aligned DECODE_ATTN_CUDA_PACKED=always" \
               "new-off2 bin/decode-attn DECODE_ATTN_CUDA_PACKED=off"; do
      set -- $run
      [ -x "$2" ] || { step "eq-$1-$m missing-$2" 0; continue; }
      env $3 $2 bench --backend cuda --model $m $GRID --csv $R/eq-$1-$m.csv > $R/eq-$1-$m.txt 2>&1; step eq-$1-$m $?
    done
    for rule in off auto; do
      DECODE_ATTN_CUDA_BATCH_RULE=$rule bin/decode-attn bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 \
        --csv $R/graph-$rule-$m.csv > $R/graph-$rule-$m.txt 2>&1; step graph-$rule-$m $?
    done
    for packing in off auto always plan; do
      DECODE_ATTN_CUDA_PACKED=$packing bin/decode-attn bench --backend cuda --model $m --lens $LENS \
        --csv $R/own-$packing-$m.csv > $R/own-$packing-$m.txt 2>&1; step own-$packing-$m $?
    done
    tar czf $OUT/r-$PART-so-far.tgz -C $OUT r-$PART  # in case the call runs out of time
  done
  # The stream kernel, whose rings at 1, 2 and 4 heads a CTA also moved to a
  # 128-byte boundary (48, 96 and 64 bytes off before).
  for b in v30 new; do
    B=bin/decode-attn; [ $b = v30 ] && B=bin/decode-attn-v30
    DECODE_ATTN_CUDA_KERNEL=stream $B bench --backend cuda --model llama3-8b $GRID \
      --csv $R/stream-$b-llama3-8b.csv > $R/stream-$b-llama3-8b.txt 2>&1; step stream-$b $?
  done
  # The ring's copies: shared-memory wavefronts of the packed entry point.
  DECODE_ATTN_CUDA_PACKED=always timeout 60 ncu --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight -k regex:decode_mma \
    --launch-count 1 --csv --page details bin/decode-attn bench --backend cuda --model llama3-70b-tp8 --batch 64 --seq-len 4096 \
    > $R/ncu-new-always.csv 2> $R/ncu-new-always.err; step ncu $?
  ;;
checks)
  GPU_TEST=$(ls tests/gpu-* | head -1); CALLER=$(ls tests/caller-* | head -1)
  bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
  timeout 200 $GPU_TEST --test-threads 1 --skip nvrtc > $R/gpu-tests.log 2>&1; step gpu-tests $?
  timeout 60 $CALLER --test-threads 1 > $R/caller.log 2>&1; step caller $?
  timeout 120 compute-sanitizer --tool memcheck $GPU_TEST --test-threads 1 packed_launches batch_rule > $R/memcheck-packed-batch.log 2>&1
  step memcheck-packed-batch $?
  ;;
esac
tar czf $OUT/r-$PART.tgz -C $OUT r-$PART && rm -rf $R $OUT/r-$PART-so-far.tgz
