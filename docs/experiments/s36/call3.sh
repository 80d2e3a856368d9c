#!/bin/bash
# s36 call 3, on an H100. Which bandwidth figure should `auto` plan an H100
# with? Three binaries/settings, each shape alternated twice:
#   own   .gpu/bin/decode-attn-old (b8c29ab): the H100's derived figure (about
#         3020 GB/s), the H200's lone-CTA share 0.95;
#   h200  the same binary with DECODE_ATTN_CUDA_PLAN_GBPS=4320: the H200's plans;
#   share .gpu/bin/decode-attn (the working tree): the H100's figure with the
#         lone-CTA share scaled by it (lone_cta_share_at: 1 on an H100).
# Shapes: every uniform batch of llama3-8b, llama3-70b-tp8, qwen2-7b and
# llama3-70b (B 1-256, s 512-65536, KV up to bench's 8 GiB) where `decode-attn
# plan --gbps 3020` and the default 4320 differ, plus call 2's. Then the NVRTC
# GPU test if time is left. Results: $OUT/c3.tgz, saved after each step.
cd "$(dirname "$0")"
R=$OUT/c3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
declare -A LENS=(
  [llama3-8b]=65536x1,8192x2,4096x4,16384x4,65536x4,2048x8,4096x16,16384x16,65536x16
  [llama3-70b-tp8]=65536x4,8192x16,16384x16,65536x16,4096x32,2048x64,4096x64,16384x64,65536x64,4096x128
  [qwen2-7b]=65536x1,8192x4,4096x8,2048x16,4096x32
  [llama3-70b]=8192x2,4096x4,2048x8,4096x16
)
for rep in 1 2; do for model in llama3-8b llama3-70b-tp8 qwen2-7b llama3-70b; do for v in own h200 share; do
  bin=bin/decode-attn-old; gbps=
  [ $v = h200 ] && gbps=4320
  [ $v = share ] && bin=bin/decode-attn
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout 60 $bin bench --backend cuda --model $model --lens ${LENS[$model]} > $R/$v-$model-$rep.txt 2>&1
  step "$v $model $rep" $?
done; done; done
if [ $(( $(date +%s) - t0 )) -lt 250 ]; then
  export DECODE_ATTN_CACHE_DIR=/tmp/decode-attn-gpu-tests
  timeout $(( 560 - $(date +%s) + t0 )) $(ls tests/gpu-* | head -1) --test-threads 1 nvrtc > $R/nvrtc.log 2>&1; step nvrtc $?
  grep -E 'test result|^test ' $R/nvrtc.log
fi
echo done
