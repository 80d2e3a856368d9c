#!/bin/bash
# Staged in s35, not yet run: does `auto`'s bandwidth figure pick better
# plans on the GPU it is derived for? On an H100 (figure about 3000 GB/s),
# the grid planned with the H100's own figure and with the H200's
# (DECODE_ATTN_CUDA_PLAN_GBPS=4320), twice each, alternated (drift); the
# shapes where the two differ in splits are the ones to read. Carry
# .gpu/bin/decode-attn (bbf271e or later) and this script, copied to
# .gpu/plan-bandwidth.sh; run from the repository root (about 5 minutes:
# s26's full grid took 116 s a run on the H200). Results: $OUT/pb.tgz.
# Read with `python3 docs/experiments/s35/plan_bandwidth.py DIR`.
cd .gpu
R=$OUT/pb; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
t0=$(date +%s)
for run in own h200 own-again h200-again; do
  case $run in own*) gbps= ;; *) gbps=4320 ;; esac
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout ${BENCH_TIMEOUT:-140} bin/decode-attn bench --backend cuda --grid peers \
    --batch ${BATCHES:-1,4,16,64} > $R/$run.txt 2>&1
  echo "$run rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt
  tar czf $OUT/pb.tgz -C $OUT pb
done
