#!/bin/bash
# s35 call 3: the two GPU tests that failed on the H100 in call 1 (their
# plans assumed the H200's bandwidth; now planned as on an H200 whatever the
# GPU), then the packing threshold for Llama-3-8B with four long sequences.
cd .gpu
R=$OUT/r; mkdir -p $R
export DECODE_ATTN_CACHE_DIR=/tmp/decode-attn-gpu-tests
t0=$(date +%s)
GPU_TEST=$(ls tests/gpu-* | head -1)
timeout 150 $GPU_TEST --test-threads 1 short_split_counts warp_splits > $R/gpu-tests.log 2>&1
echo "gpu-tests rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt
grep -E 'test result|^test ' $R/gpu-tests.log
tar czf $OUT/r.tgz -C $OUT r
cd ..
MODEL=llama3-8b KS=4 BENCH_TIMEOUT=140 bash .gpu/packing-threshold.sh
