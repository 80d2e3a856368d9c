#!/bin/bash
# s36 call 1, on whatever GPU the call gets. Carry .gpu (staged with
# `gpu-stage --peers --bin decode-attn`); run from the repository root as
# `bash .gpu/call1.sh`. Results: $OUT/c1.tgz, saved after each step.
#  1. The grid at B=64, ours then the peers in the same call,
#     compare.py with and without SDPA (s35 measured B=1, 4, 16 only).
#  2. The three grid shapes whose plan depends on the bandwidth figure
#     (`decode-attn plan --gbps 3020` against the default 4320: 8B B=4 and
#     B=16 at s=4096, 70B B=4 at s=65536), planned with this GPU's own figure
#     and with the H200's, alternated three times; the other three shapes of
#     the same invocation plan alike and serve as controls for drift.
#  3. One ragged batch that packs (64 sequences), to see bench's
#     "launched packed" note on CUDA.
cd .gpu
R=$OUT/c1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
timeout 200 bin/decode-attn bench --backend cuda --grid peers --batch 64 --csv $R/ours64.csv > $R/ours64.txt 2>&1; step ours64 $?
SHAPES=""
for m in llama3-8b llama3-70b-tp8; do for s in 1024 4096 16384 65536; do SHAPES="$SHAPES,$m:64:$s"; done; done
timeout 260 python3 peers/bench_peers.py --shapes ${SHAPES#,} --out $R/peers64.csv > $R/peers64.log 2>&1; step peers64 $?
grep -v ',torch-sdpa,' $R/peers64.csv > $R/peers64-paged.csv
python3 peers/compare.py $R/ours64.csv $R/peers64-paged.csv > $R/compare64-paged.txt 2>&1
python3 peers/compare.py $R/ours64.csv $R/peers64.csv > $R/compare64.txt 2>&1; step compare64 $?
cat $R/compare64.txt
for run in own h200 own-2 h200-2 own-3 h200-3; do
  case $run in own*) gbps= ;; *) gbps=4320 ;; esac
  DECODE_ATTN_CUDA_PLAN_GBPS=$gbps timeout 60 bin/decode-attn bench --backend cuda --model llama3-8b,llama3-70b-tp8 \
    --lens 4096x4,4096x16,65536x4 > $R/pb-$run.txt 2>&1; step pb-$run $?
done
timeout 40 bin/decode-attn bench --backend cuda --model llama3-70b-tp8 --lens 65536x4+256x60,4096x8+256x24 > $R/note.txt 2>&1; step note $?
grep -E 'launched|ragged' $R/note.txt
