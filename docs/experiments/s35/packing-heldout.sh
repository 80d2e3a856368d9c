#!/bin/bash
# s35 call 4: s35's packing rule (8 empty CTAs per active one below 64
# sequences, 2 from 64) on batches the fit did not see: 32 and 128
# sequences, one or four long among short ones. Each batch planned for
# itself, run with packing off, `auto` (the rule) and always. Run from the
# repository root on the GPU machine with .gpu/bin/decode-attn carried.
# Results: $OUT/heldout.tgz, saved after each run.
cd .gpu
R=$OUT/heldout; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
LENS=""
for n in 32 128; do for k in 1 4; do for long in 8192 32768; do for short in 512 2048; do
  LENS="$LENS,${long}x$k+${short}x$((n - k))"
done; done; done; done
LENS=${LENS#,}
t0=$(date +%s)
for model in llama3-70b-tp8 llama3-8b; do
  limit=70; [ $model = llama3-8b ] && limit=120
  for packing in off auto always; do
    DECODE_ATTN_CUDA_PACKED=$packing timeout $limit bin/decode-attn bench --backend cuda --model $model --lens $LENS \
      > $R/$model-$packing.txt 2>&1
    echo "$model $packing rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt
    tar czf $OUT/heldout.tgz -C $OUT heldout
  done
done
