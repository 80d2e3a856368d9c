#!/bin/bash
# s37 call 4: after gpu_plan_gbps (an H100 planned as an H200), the default
# binary's plans against DECODE_ATTN_CUDA_PLAN_GBPS=4320 (must match) and
# =3020 (the H100's own figure, now only by override), on held-out shapes;
# then the GPU test binary without the NVRTC test. Results: $OUT/cf.tgz.
cd "$(dirname "$0")"
R=$OUT/cf; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/cf.tgz -C $OUT cf; }
declare -A LENS=([falcon-7b]=512x32,8192x48,4096x4 [llama3-8b]=4096x16,4096x6 [phi3-mini]=8192x1,6144x4 [starcoder-15b]=16384x4 [gemma2-9b]=512x12)
for model in falcon-7b llama3-8b phi3-mini starcoder-15b gemma2-9b; do for v in default h200 own; do
  gbps=; [ $v = h200 ] && gbps=4320; [ $v = own ] && gbps=3020
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout 60 bin/decode-attn bench --backend cuda --model $model --lens ${LENS[$model]} > $R/$v-$model.txt 2>&1
  step "$v $model" $?
done; done
for f in $R/default-*.txt; do m=${f#$R/default-}; echo "== $m"; paste <(grep -E ' cuda ' $f | awk '{print $1,$2,$3,"splits",$6,$7}') <(grep -E ' cuda ' $R/h200-$m | awk '{print "h200",$6,$7}') <(grep -E ' cuda ' $R/own-$m | awk '{print "own",$6,$7}'); done | tee $R/summary.txt
export DECODE_ATTN_CACHE_DIR=/tmp/decode-attn-gpu-tests
timeout $(( 540 - $(date +%s) + t0 )) $(ls tests/gpu-* | head -1) --test-threads 1 --skip nvrtc > $R/gpu-tests.log 2>&1; step gpu-tests $?
grep -E 'test result|FAILED|panicked' $R/gpu-tests.log | head
