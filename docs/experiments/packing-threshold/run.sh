#!/bin/bash
# Refits PACK_MIN_EMPTY_PER_ACTIVE (crates/cuda/src/lib.rs): each ragged
# batch below planned for itself, packing off against always, on the GPU
# machine from the repository root, one model a `device` call:
#   MODEL=llama3-70b-tp8 bash .gpu/packing-threshold.sh        (estimated 3-5 minutes)
#   MODEL=llama3-8b KS=1 bash .gpu/packing-threshold.sh        (8B's KV is 8 times
#   MODEL=llama3-8b KS=4 bash .gpu/packing-threshold.sh         70B's: two calls)
# NS picks the batch sizes (default 16 64 256).
# (estimates from s33's ragged runs, about 1 s a 70B batch; 8B not timed).
# Carry .gpu/bin/decode-attn (gpu-stage --bin decode-attn, at a commit whose
# `bench` prints the "#   auto: P of the B x S (sequence, split) pairs
# active" note, 051d92b or later) and this script, copied to
# .gpu/packing-threshold.sh. Results: $OUT/pt-MODEL-kKS.tgz, saved after
# each run; read them with `python3 docs/experiments/packing-threshold/fit.py DIR`.
cd .gpu
MODEL=${MODEL:-llama3-70b-tp8}
KS=${KS:-1 4}
NS=${NS:-16 64 256}
R=$OUT/pt-$MODEL-k${KS// /}; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
# One or four long sequences among 15, 63 or 255 short ones: from about 1
# to 31 empty CTAs per active pair in the plain grid (`decode-attn plan`).
LENS=""
for k in $KS; do for n in $NS; do for long in 8192 16384 32768 65536; do for short in 256 1024; do
  LENS="$LENS,${long}x$k+${short}x$((n - k))"
done; done; done; done
LENS=${LENS#,}
t0=$(date +%s)
for packing in off always off; do
  tag=$packing; [ -e $R/$packing.txt ] && tag=$packing-again
  DECODE_ATTN_CUDA_PACKED=$packing timeout ${BENCH_TIMEOUT:-190} bin/decode-attn bench --backend cuda --model $MODEL --lens $LENS \
    > $R/$tag.txt 2>&1
  echo "$tag rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt
  tar czf $R.tgz -C $OUT $(basename $R)
done
