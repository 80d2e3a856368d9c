#!/bin/bash
# s34 call 2: e10-warp-pair.patch (bin/decode-attn-e10) against main
# (bin/decode-attn) with packing forced on and with the batch rule, `off`
# before and after as the drift, both models (MODELS to choose); then the
# packing-threshold kit for 70B at TP=8 if time is left (PT=0 to skip).
# Results: $OUT/t.tgz (and $OUT/pt-*.tgz), saved after each step.
cd .gpu
R=$OUT/t; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/t.tgz -C $OUT t; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
for m in ${MODELS:-llama3-70b-tp8 llama3-8b}; do
  if [ $m = llama3-8b ]; then GRID="--batch 4,16 --seq-len 1024,4096"; else GRID="--batch 4,16,64 --seq-len 1024,4096,16384"; fi
  for run in "main-off bin/decode-attn DECODE_ATTN_CUDA_PACKED=off" \
             "main-always bin/decode-attn DECODE_ATTN_CUDA_PACKED=always" \
             "e10-always bin/decode-attn-e10 DECODE_ATTN_CUDA_PACKED=always" \
             "main-batch bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "e10-batch bin/decode-attn-e10 DECODE_ATTN_CUDA_BATCH_RULE=auto" \
             "main-off-again bin/decode-attn DECODE_ATTN_CUDA_PACKED=off"; do
    set -- $run
    env $3 timeout 60 $2 bench --backend cuda --model $m $GRID --csv $R/eq-$1-$m.csv > $R/eq-$1-$m.txt 2>&1; step eq-$1-$m $?
  done
done
if [ "${PT:-1}" = 1 ] && [ $(( $(date +%s) - t0 )) -lt 200 ]; then
  (cd .. && MODEL=llama3-70b-tp8 bash docs/experiments/packing-threshold/run.sh)
fi
echo done
