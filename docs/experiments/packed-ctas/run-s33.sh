#!/bin/bash
# s33: the packed prologue's shorter chain (packed_item keeps a thread's
# first sequence's guards and cut; the pair's owner hands them over through
# shared memory). bin/decode-attn-base = main at 1c9ea54 (kernels as
# 6ed6670), bin/decode-attn = with the change. One device call, < 10 min.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/r.tgz -C $OUT r; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
# Conformance of the change first (packed and batch entry points).
GPU_TEST=$(ls tests/gpu-* | head -1)
bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
tail -1 $R/check.log
timeout 120 $GPU_TEST --test-threads 1 packed_launches batch_rule > $R/gpu-tests-packed-batch.log 2>&1; step gpu-tests $?
timeout 120 compute-sanitizer --tool memcheck $GPU_TEST --test-threads 1 packed_launches batch_rule > $R/memcheck.log 2>&1; step memcheck $?
tail -2 $R/memcheck.log
LENS=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
for m in llama3-70b-tp8 llama3-8b; do
  if [ $m = llama3-8b ]; then GRID="--batch 4,16 --seq-len 1024,4096,16384"; else GRID="--batch 4,16,64 --seq-len 1024,4096,16384"; fi
  for run in "base-off bin/decode-attn-base DECODE_ATTN_CUDA_PACKED=off" \
             "base-always bin/decode-attn-base DECODE_ATTN_CUDA_PACKED=always" \
             "new-always bin/decode-attn DECODE_ATTN_CUDA_PACKED=always" \
             "base-batch bin/decode-attn-base DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "new-batch bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "new-off bin/decode-attn DECODE_ATTN_CUDA_PACKED=off"; do
    set -- $run
    env $3 timeout 120 $2 bench --backend cuda --model $m $GRID --csv $R/eq-$1-$m.csv > $R/eq-$1-$m.txt 2>&1; step eq-$1-$m $?
  done
  for run in "base-off bin/decode-attn-base off" "base-auto bin/decode-attn-base auto" "new-auto bin/decode-attn auto"; do
    set -- $run
    DECODE_ATTN_CUDA_BATCH_RULE=$3 timeout 120 $2 bench --backend cuda --model $m --lens $LENS --plan-seq-len 65536 \
      --csv $R/graph-$1-$m.csv > $R/graph-$1-$m.txt 2>&1; step graph-$1-$m $?
  done
  [ $m = llama3-8b ] && continue
  for run in "base-auto bin/decode-attn-base auto" "new-auto bin/decode-attn auto"; do
    set -- $run
    DECODE_ATTN_CUDA_PACKED=$3 timeout 120 $2 bench --backend cuda --model $m --lens $LENS \
      --csv $R/own-$1-$m.csv > $R/own-$1-$m.txt 2>&1; step own-$1-$m $?
  done
done
# The stream kernel's rings (s31's alignment): v30 against main, 8B.
for b in v30 base; do
  DECODE_ATTN_CUDA_KERNEL=stream timeout 120 bin/decode-attn-$b bench --backend cuda --model llama3-8b --batch 4,16 --seq-len 1024,4096,16384 \
    --csv $R/stream-$b-llama3-8b.csv > $R/stream-$b-llama3-8b.txt 2>&1; step stream-$b $?
done
echo done
