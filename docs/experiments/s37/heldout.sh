#!/bin/bash
# s37, staged for the next H100: a held-out check of s36's lone-CTA share
# ceiling (GPU_LONE_CTA_SHARE_MAX = 0.97, fitted on s36 call 3's 28 shapes,
# nothing held out). 40 other uniform batches of eight models where `auto`
# on an H100 (`decode-attn plan --gbps 3020`) and on an H200 (the default)
# split differently, none of them among the 28 (`heldout-shapes.txt`, from
# `plan-diff.sh`). Two settings of the same binary, alternated twice:
#   own   the H100's own plans (its derived figure, the share scaled and capped);
#   h200  DECODE_ATTN_CUDA_PLAN_GBPS=4320: the H200's plans.
# Read with `python3 heldout.py DIR`. Carry .gpu (gpu-stage --bin
# decode-attn) with this directory copied into it; run from .gpu. About 8
# minutes (s36 call 3 ran 168 model-settings in 510 s). Results: $OUT/ho.tgz,
# saved after each step.
cd "$(dirname "$0")"
R=$OUT/ho; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/ho.tgz -C $OUT ho; }
declare -A LENS=(
  [llama3-8b]=32768x1,12288x2,6144x4,4096x6,3072x8,16384x12,8192x24,16384x48
  [llama3-70b-tp8]=32768x8,16384x12,12288x16,6144x32,8192x48,3072x64,16384x96
  [qwen2-7b]=32768x2,16384x3,6144x8,8192x12,16384x24
  [phi3-mini]=8192x1,4096x2,6144x4,12288x6
  [starcoder-15b]=16384x4,32768x6,8192x12,16384x32,12288x64
  [falcon-7b]=65536x2,4096x4,12288x6,1024x16,8192x48
  [llama3-405b-tp8]=16384x1,4096x2,32768x8,16384x16,4096x48
  [gemma2-9b]=3072x3
)
for rep in 1 2; do for model in "${!LENS[@]}"; do for v in own h200; do
  gbps=; [ $v = h200 ] && gbps=4320
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout 60 bin/decode-attn bench --backend cuda --model $model --lens ${LENS[$model]} > $R/$v-$model-$rep.txt 2>&1
  step "$v $model $rep" $?
done; done; done
python3 heldout.py $R | tee $R/heldout.txt
