#!/bin/bash
# s34 call 1: conformance of main's kernels (last kernel change 5afb917)
# beyond what s33 ran: every gpu.rs test with NVRTC included, caller.rs,
# racecheck/synccheck/initcheck over the packed and batch-rule tests and
# the check sweep; then e10-warp-pair.patch's sweep with packing forced on
# and with the batch rule. Results: $OUT/r.tgz, saved after each step.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/r.tgz -C $OUT r; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
left() { [ $(( $(date +%s) - t0 )) -lt ${1:-480} ]; }
GPU_TEST=$(ls tests/gpu-* | head -1); CALLER_TEST=$(ls tests/caller-* | head -1)
bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
tail -1 $R/check.log
timeout 240 $GPU_TEST --test-threads 1 > $R/gpu-tests.log 2>&1; step gpu-tests $?
grep 'test result' $R/gpu-tests.log
timeout 90 $CALLER_TEST --test-threads 1 > $R/caller-tests.log 2>&1; step caller-tests $?
grep 'test result' $R/caller-tests.log
for tool in synccheck initcheck racecheck; do
  left 420 || break
  timeout 120 compute-sanitizer --tool $tool bin/decode-attn check --backend cuda > $R/$tool-check.log 2>&1; step $tool-check $?
  tail -2 $R/$tool-check.log
  left 420 || break
  timeout 150 compute-sanitizer --tool $tool $GPU_TEST --test-threads 1 packed_launches batch_rule one_active_split > $R/$tool-gpu.log 2>&1; step $tool-gpu $?
  tail -2 $R/$tool-gpu.log
done
if [ -x bin/decode-attn-e10 ] && left 500; then
  DECODE_ATTN_CUDA_PACKED=always bin/decode-attn-e10 check --backend cuda > $R/check-e10-always.log 2>&1; step check-e10-always $?
  tail -1 $R/check-e10-always.log
  DECODE_ATTN_CUDA_BATCH_RULE=auto bin/decode-attn-e10 check --backend cuda > $R/check-e10-batch.log 2>&1; step check-e10-batch $?
  tail -1 $R/check-e10-batch.log
fi
echo done
