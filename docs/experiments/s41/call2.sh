#!/bin/bash
# s41 call 2, by the GPU that comes. H200 (the targets' GPU): s36's
# table-h200.sh (the issue's grid, ours then the peers', compare.py; last
# run in s26). Otherwise: the sanitizers over main's kernels, none of which
# has run since the LSE (0fa9072) added stores to every epilogue: memcheck,
# racecheck, synccheck and initcheck over `check --backend cuda` (the
# default kernels), memcheck and racecheck over it on the kv-head-grid
# kernel, and memcheck over the gpu tests of packed launches, the batch
# rule and the lone split. Copy this file, call1.sh's neighbours and
# ../s36/table-h200.sh into .gpu; carry .gpu; run as `bash .gpu/call2.sh`.
# Results: $OUT/t.tgz (table) or $OUT/s.tgz (sanitizers).
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
R=$OUT/s; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/s.tgz -C $OUT s; }
left() { [ $(( $(date +%s) - t0 )) -lt ${1:-480} ]; }
GPU_TEST=$(ls tests/gpu-* | head -1)
for tool in memcheck racecheck synccheck initcheck; do
  left 500 || break
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 bin/decode-attn check --backend cuda > $R/$tool-check.log 2>&1; step $tool-check $?
  tail -2 $R/$tool-check.log
done
for tool in memcheck racecheck; do
  left 430 || break
  DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 bin/decode-attn check --backend cuda > $R/$tool-kvgrid-check.log 2>&1; step $tool-kvgrid-check $?
  tail -2 $R/$tool-kvgrid-check.log
done
left 450 && { timeout 140 compute-sanitizer --tool memcheck --error-exitcode 3 $GPU_TEST --test-threads 1 packed_launches batch_rule one_active_split > $R/memcheck-gpu.log 2>&1; step memcheck-gpu $?; tail -3 $R/memcheck-gpu.log; }
echo done
