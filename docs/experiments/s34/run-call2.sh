#!/bin/bash
# s34 call 2 (one device call, under 10 minutes): (1) racecheck over the GPU
# test that found s34's hazard in the kv-head-grid kernel (its running
# softmax state now in registers) and that kernel's grid-order test;
# (2) e10-warp-pair.patch's conformance sweep with packing forced on and
# with the batch rule; (3) the packing-threshold kit for 70B at TP=8;
# (4) if time is left (the call was cut to the 574 s of device time left), e10 against main on the short and long shapes.
# Results: $OUT/c2.tgz and $OUT/pt-*.tgz, saved after each step.
cd .gpu
R=$OUT/c2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/c2.tgz -C $OUT c2; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
left() { [ $(( $(date +%s) - t0 )) -lt $1 ]; }
GPU_TEST=$(ls tests/gpu-* | head -1)
timeout 90 compute-sanitizer --tool racecheck $GPU_TEST --test-threads 1 one_active_split grid_orders > $R/racecheck-kvgrid.log 2>&1; step racecheck-kvgrid $?
tail -3 $R/racecheck-kvgrid.log
# Call 1 ran out of time inside the NVRTC test (it compiles decode.cu, about
# 100 s): the other 15, NVRTC skipped.
timeout 60 $GPU_TEST --test-threads 1 --skip nvrtc > $R/gpu-tests.log 2>&1; step gpu-tests $?
grep 'test result' $R/gpu-tests.log
DECODE_ATTN_CUDA_PACKED=always timeout 40 bin/decode-attn-e10 check --backend cuda > $R/check-e10-always.log 2>&1; step check-e10-always $?
tail -1 $R/check-e10-always.log
DECODE_ATTN_CUDA_BATCH_RULE=auto timeout 40 bin/decode-attn-e10 check --backend cuda > $R/check-e10-batch.log 2>&1; step check-e10-batch $?
tail -1 $R/check-e10-batch.log
(cd .. && MODEL=llama3-70b-tp8 BENCH_TIMEOUT=75 bash docs/experiments/packing-threshold/run.sh)
step packing-threshold $?
m=llama3-70b-tp8; GRID="--batch 4,16,64 --seq-len 1024,16384"
for run in "main-off bin/decode-attn DECODE_ATTN_CUDA_PACKED=off" \
           "main-always bin/decode-attn DECODE_ATTN_CUDA_PACKED=always" \
           "e10-always bin/decode-attn-e10 DECODE_ATTN_CUDA_PACKED=always" \
           "main-batch bin/decode-attn DECODE_ATTN_CUDA_BATCH_RULE=auto" \
           "e10-batch bin/decode-attn-e10 DECODE_ATTN_CUDA_BATCH_RULE=auto" \
           "main-off-again bin/decode-attn DECODE_ATTN_CUDA_PACKED=off"; do
  left 380 || break
  set -- $run
  env $3 timeout 40 $2 bench --backend cuda --model $m $GRID --csv $R/eq-$1-$m.csv > $R/eq-$1-$m.txt 2>&1; step eq-$1-$m $?
done
echo done
