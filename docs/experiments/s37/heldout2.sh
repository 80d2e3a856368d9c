#!/bin/bash
# s37 call 3, on an H100: a second held-out set. Call 1 (heldout.sh) found
# the H200's plans faster on an H100 than the H100's own on 40 shapes
# (geometric mean 1.033 own/h200). Are they on 49 others, drawn at random
# (seed 37, at most 5 a model, KV <= 2 GiB) from the rest of
# heldout-shapes.txt? Same two settings, alternated twice. Results:
# $OUT/ho2.tgz; read with `python3 heldout.py DIR`.
cd "$(dirname "$0")"
R=$OUT/ho2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/ho2.tgz -C $OUT ho2; }
declare -A LENS=(
  [falcon-7b]=49152x2,6144x12,512x32,6144x48,4096x96
  [gemma2-9b]=512x12
  [llama3-405b-tp8]=6144x1,4096x24,3072x48,12288x48,16384x96
  [llama3-70b]=32768x1,6144x4,16384x6,3072x8,16384x24
  [llama3-70b-tp8]=6144x48,12288x48,16384x48
  [llama3-8b]=8192x6,12288x6,16384x6,12288x24,16384x24
  [mistral-7b]=32768x1,8192x6,16384x12,12288x24,16384x24
  [phi3-mini]=1024x3,512x6,16384x6,24576x6,12288x12
  [qwen2-72b]=32768x1,12288x2,12288x6,16384x12,16384x24
  [qwen2-7b]=12288x4,6144x12,12288x12,16384x12,8192x48
  [starcoder-15b]=24576x3,65536x12,12288x128,32768x128,16384x256
)
for rep in 1 2; do for model in "${!LENS[@]}"; do for v in own h200; do
  gbps=; [ $v = h200 ] && gbps=4320
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout 60 bin/decode-attn bench --backend cuda --model $model --lens ${LENS[$model]} > $R/$v-$model-$rep.txt 2>&1
  step "$v $model $rep" $?
done; done; done
python3 heldout.py $R | tee $R/heldout.txt
