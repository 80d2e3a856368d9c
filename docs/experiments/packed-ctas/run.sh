#!/bin/bash
# On the GPU machine, from the repository root, two calls (each under the
# 10-minute limit):
#   MODELS=llama3-70b-tp8 bash .gpu/run-packed-ctas.sh        (with ncu)
#   MODELS=llama3-8b NCU=0 bash .gpu/run-packed-ctas.sh
# Same plans, equal lengths (the grid at B = 4, 16, 64), µs per call:
#   off     the plain grid (main's default)
#   always  s27's packed launch (DECODE_ATTN_CUDA_PACKED=always)
#   e1      packed, pairs numbered split-major as the plain grid orders them
#   e2      packed, no later pairs: no call, no stack (205 registers)
#   e3      the plain grid, each CTA running the packed prologue first (205 registers)
#   e4      packed, the lengths walked as the batch entry points walk them (s29)
#   e5      e4 without later pairs (e2 + e4)
#   e6      packed, every pair through one loop with the item inlined, e4's walk
#   batch   s28's batch rule (DECODE_ATTN_CUDA_BATCH_RULE=auto), its walk as of s29
# then ncu with source counters (per-SASS stall samples) at 70B B=64 s=4096.
cd .gpu
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
GRID="--batch 4,16,64 --seq-len 1024,4096,16384"
# One round of every variant per model, then the plain grid again (the
# run's noise).
MODELS=${MODELS:-llama3-70b-tp8}
NCU=${NCU:-1}
run() {  # run NAME BINARY [ENV=VALUE...]
  local name=$1 bin=$2; shift 2
  env "$@" $bin bench --backend cuda --model $m $GRID --csv $R/$name-$m.csv > $R/$name-$m.txt 2>&1
}
for m in $MODELS; do
  run off    bin/decode-attn    DECODE_ATTN_CUDA_PACKED=off
  run always bin/decode-attn    DECODE_ATTN_CUDA_PACKED=always
  run e1     bin/decode-attn-e1 DECODE_ATTN_CUDA_PACKED=always
  run e2     bin/decode-attn-e2 DECODE_ATTN_CUDA_PACKED=always
  run e3     bin/decode-attn-e3 DECODE_ATTN_CUDA_PACKED=off
  run e4     bin/decode-attn-e4 DECODE_ATTN_CUDA_PACKED=always
  run e5     bin/decode-attn-e5 DECODE_ATTN_CUDA_PACKED=always
  run e6     bin/decode-attn-e6 DECODE_ATTN_CUDA_PACKED=always
  run batch  bin/decode-attn    DECODE_ATTN_CUDA_BATCH_RULE=auto
  run off2   bin/decode-attn    DECODE_ATTN_CUDA_PACKED=off
done
[ "$NCU" = 1 ] && for v in off always e3 e5; do
  B=bin/decode-attn; P=$v; [ $v = e3 ] && { B=bin/decode-attn-e3; P=off; }; [ $v = e5 ] && { B=bin/decode-attn-e5; P=always; }
  DECODE_ATTN_CUDA_PACKED=$P timeout 150 ncu --set full -k regex:decode_mma --launch-count 1 -o $R/ncu-$v \
    $B bench --backend cuda --model llama3-70b-tp8 --batch 64 --seq-len 4096 > $R/ncu-$v.log 2>&1
  ncu -i $R/ncu-$v.ncu-rep --page source --csv --print-source sass > $R/src-$v.csv 2> $R/src-$v.err \
    || ncu -i $R/ncu-$v.ncu-rep --page source --csv > $R/src-$v.csv 2>> $R/src-$v.err
  ncu -i $R/ncu-$v.ncu-rep --page details --csv > $R/details-$v.csv 2>&1
done
tar czf $OUT/r-${MODELS// /-}.tgz -C $OUT r
