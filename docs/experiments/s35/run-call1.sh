#!/bin/bash
# s35 call 1: the kv-head-grid race fix (0fbbee5) on a GPU, and the GPU
# tests s34's calls ran out of time for. The CLI and the GPU tests share
# one kernel cache, so the kv-head-grid kernel (NVRTC on CUDA, ~40 s)
# compiles once. Results: $OUT/r.tgz, saved after each step.
cd .gpu
R=$OUT/r; mkdir -p $R
export DECODE_ATTN_CACHE_DIR=/tmp/decode-attn-gpu-tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
save() { tar czf $OUT/r.tgz -C $OUT r; }
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; save; }
left() { [ $(( $(date +%s) - t0 )) -lt ${1:-480} ]; }
GPU_TEST=$(ls tests/gpu-* | head -1)
bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
tail -1 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 170 bin/decode-attn check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?
tail -1 $R/check-kvgrid.log; ls -la $DECODE_ATTN_CACHE_DIR >> $R/cache.txt 2>&1
timeout 200 $GPU_TEST --test-threads 1 --skip nvrtc_kernels_match > $R/gpu-tests.log 2>&1; step gpu-tests $?
grep -E 'test result|^test ' $R/gpu-tests.log
left 400 && { timeout 120 compute-sanitizer --tool racecheck $GPU_TEST --test-threads 1 one_active_split grid_orders > $R/racecheck-gpu.log 2>&1; step racecheck-gpu $?; tail -3 $R/racecheck-gpu.log; }
left 460 && { DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 90 compute-sanitizer --tool racecheck bin/decode-attn check --backend cuda > $R/racecheck-kvgrid-check.log 2>&1; step racecheck-kvgrid-check $?; tail -2 $R/racecheck-kvgrid-check.log; }
left 500 && { DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 60 compute-sanitizer --tool memcheck bin/decode-attn check --backend cuda > $R/memcheck-kvgrid-check.log 2>&1; step memcheck-kvgrid-check $?; tail -2 $R/memcheck-kvgrid-check.log; }
echo done
