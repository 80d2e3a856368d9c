#!/bin/bash
# s33, one device call (about 3 minutes a model). bin/decode-attn-base = main at
# 1c9ea54 (kernels as 6ed6670); bin/decode-attn-s33a = + packed_item's
# shorter chain (094fdb4); bin/decode-attn = + `_packed` taking its
# parameters as __grid_constant__ (no 152-byte stack copy, no local loads
# in its loops); bin/decode-attn-e10, if staged = bin/decode-attn +
# e10-warp-pair.patch (up to 32 sequences: the pair found by every warp with
# shuffles, no barrier). Results: $OUT/r.tgz, saved after every step.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/r.tgz -C $OUT r; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
GPU_TEST=$(ls tests/gpu-* | head -1)
bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
tail -1 $R/check.log
timeout 90 $GPU_TEST --test-threads 1 packed_launches batch_rule > $R/gpu-tests-packed-batch.log 2>&1; step gpu-tests $?
timeout 90 compute-sanitizer --tool memcheck $GPU_TEST --test-threads 1 packed_launches batch_rule > $R/memcheck.log 2>&1; step memcheck $?
tail -2 $R/memcheck.log
# e10 (e10-warp-pair.patch, s33, not on main): the conformance sweep with
# every split plan packed, and with the batch rule, before it is timed.
if [ -x bin/decode-attn-e10 ]; then
  DECODE_ATTN_CUDA_PACKED=always bin/decode-attn-e10 check --backend cuda > $R/check-e10-always.log 2>&1; step check-e10-always $?
  tail -1 $R/check-e10-always.log
  DECODE_ATTN_CUDA_BATCH_RULE=auto bin/decode-attn-e10 check --backend cuda > $R/check-e10-batch.log 2>&1; step check-e10-batch $?
  tail -1 $R/check-e10-batch.log
fi
LENS=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
for m in ${MODELS:-llama3-70b-tp8 llama3-8b}; do
  if [ $m = llama3-8b ]; then GRID="--batch 4,16 --seq-len 1024,4096"; else GRID="--batch 4,16,64 --seq-len 1024,4096,16384"; fi
  for run in "base-off bin/decode-attn-base DECODE_ATTN_CUDA_PACKED=off" \
             "base-always bin/decode-attn-base DECODE_ATTN_CUDA_PACKED=always" \
             "a-always bin/decode-attn-s33a DECODE_ATTN_CUDA_PACKED=always" \
             "b-always bin/decode-attn DECODE_ATTN_CUDA_PACKED=always" \
             "base-batch bin/decode-attn-base DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "b-batch bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "e10-always bin/decode-attn-e10 DECODE_ATTN_CUDA_PACKED=always" \
             "e10-batch bin/decode-attn-e10 DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "b-off bin/decode-attn DECODE_ATTN_CUDA_PACKED=off"; do
    set -- $run
    [ -x $2 ] || continue
    env $3 timeout 60 $2 bench --backend cuda --model $m $GRID --csv $R/eq-$1-$m.csv > $R/eq-$1-$m.txt 2>&1; step eq-$1-$m $?
  done
  [ $m = llama3-8b ] && continue
  for run in "base-auto bin/decode-attn-base auto" "b-auto bin/decode-attn auto"; do
    set -- $run
    DECODE_ATTN_CUDA_BATCH_RULE=$3 timeout 60 $2 bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 \
      --csv $R/graph-$1-$m.csv > $R/graph-$1-$m.txt 2>&1; step graph-$1-$m $?
  done
  DECODE_ATTN_CUDA_PACKED=auto timeout 60 bin/decode-attn bench --backend cuda --model $m --lens $LENS \
      --csv $R/own-b-auto-$m.csv > $R/own-b-auto-$m.txt 2>&1; step own-b-auto-$m $?
done
echo done
