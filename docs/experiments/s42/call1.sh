#!/bin/bash
# s42 call 1: main at the session's start (608aad5), by the GPU that comes.
# H200: s36's table-h200.sh (the issue's grid beside the peers; last run in
# s26, version 26). Otherwise (an H100): what was last timed on version 25
# (s19, an H200) and never on the final kernels: batch 256 beside the peers,
# the twelve ragged batches of s19 (ours only: bench_peers.py takes uniform
# batches), B = 64 of the grid beside the peers (last s36 on the H100), the
# small grid cold; `check` first.
# Stage main (`gpu-stage --peers --bin decode-attn`), copy this file and
# ../s36/table-h200.sh into .gpu, carry .gpu, run `bash .gpu/call1.sh`.
# Results: $OUT/t.tgz (table) or $OUT/c1.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
timeout 60 bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
timeout 90 bin/decode-attn bench --backend cuda --grid peers --batch 64 --csv $R/ours64.csv > $R/ours64.txt 2>&1; step ours64 $?
timeout 90 bin/decode-attn bench --backend cuda --batch 256 --seq-len 1024,4096 --csv $R/ours256.csv > $R/ours256.txt 2>&1; step ours256 $?
RAGGED=32768x1+512x63,65536x1+1024x15,spread:64:128-8192,spread:16:256-32768,spread:256:64-4096,16384x4+256x60
timeout 120 bin/decode-attn bench --backend cuda --lens $RAGGED --csv $R/ragged.csv > $R/ragged.txt 2>&1; step ragged $?
SHAPES=""
for m in llama3-8b llama3-70b-tp8; do
  for s in 1024 4096 16384; do SHAPES="$SHAPES,$m:64:$s"; done
  for s in 1024 4096; do SHAPES="$SHAPES,$m:256:$s"; done
done
timeout $(( 480 - $(date +%s) + t0 )) python3 peers/bench_peers.py --shapes ${SHAPES#,} --out $R/peers.csv > $R/peers.log 2>&1; step peers $?
cat $R/ours64.csv <(tail -n +2 $R/ours256.csv) > $R/ours.csv
grep -v ',torch-sdpa,' $R/peers.csv > $R/peers-paged.csv
python3 peers/compare.py $R/ours.csv $R/peers-paged.csv > $R/compare-paged.txt 2>&1
python3 peers/compare.py $R/ours.csv $R/peers.csv > $R/compare.txt 2>&1; step compare $?
cat $R/compare.txt
left=$(( 560 - $(date +%s) + t0 ))
[ $left -gt 30 ] && { timeout $left bin/decode-attn bench --backend cuda --cold --csv $R/cold.csv > $R/cold.txt 2>&1; step cold $?; }
