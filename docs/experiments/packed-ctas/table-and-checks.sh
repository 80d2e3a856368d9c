#!/bin/bash
# The rest of a GPU session's evidence, after the packed-CTA runs, in two
# `device` calls (each under the 10-minute limit), from the repository root:
#   PART=table  bash .gpu/table-and-checks.sh   ours on the peers' grid, the
#               peers (vLLM, SGLang, torch SDPA) in the same call, compare.py
#               with and without SDPA (about 5 minutes; s26 call 3 took 276 s)
#   PART=checks bash .gpu/table-and-checks.sh   `decode-attn check`, the GPU
#               and caller tests, compute-sanitizer memcheck on the caller
#               tests (about 6 minutes)
#   PART=nvrtc  bash .gpu/table-and-checks.sh   the test that compiles every
#               kernel with NVRTC at run time (170 s in s28), if time is left
# Carry .gpu/bin/decode-attn, .gpu/tests, .gpu/peers and this script
# (staged by `../shared/tools/gpu-stage --peers --bin decode-attn -- -p
# decode-attn-cuda -p decode-attn-cli --release`, then copied to
# .gpu/table-and-checks.sh). Results: $OUT/r-$PART.tgz.
cd .gpu
R=$OUT/r-$PART; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" >> $R/progress.txt; }
case "${PART:-table}" in
table)
  bin/decode-attn bench --backend cuda --grid peers --csv $R/ours.csv > $R/ours.txt 2>&1; step ours $?
  python3 peers/bench_peers.py --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
  grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
  python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
  python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1
  ;;
checks)
  GPU_TEST=$(ls tests/gpu-* | head -1); CALLER=$(ls tests/caller-* | head -1)
  bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?
  timeout 200 $GPU_TEST --test-threads 1 --skip nvrtc > $R/gpu-tests.log 2>&1; step gpu-tests $?
  timeout 60 $CALLER --test-threads 1 > $R/caller.log 2>&1; step caller $?
  timeout 150 compute-sanitizer --tool memcheck $CALLER --test-threads 1 > $R/memcheck-caller.log 2>&1; step memcheck-caller $?
  ;;
nvrtc)
  GPU_TEST=$(ls tests/gpu-* | head -1)
  timeout 300 $GPU_TEST --test-threads 1 nvrtc > $R/nvrtc-test.log 2>&1; step nvrtc $?
  ;;
esac
tar czf $OUT/r-$PART.tgz -C $OUT r-$PART
