#!/bin/bash
# s42 call 2, by the GPU that comes. H200: s36's table-h200.sh. An H100:
#  1. kernels/cuda/probe/layout_probe.cu, built here, 3 rounds of nhd-shuf,
#     nhd-order, nhd-pf2, nhd-pf4, nhd-local, nhd-t8, nhd-t16 and nhd-l8
#     (mask 0xfc3): is what the shuffled table costs address translation
#     (nhd-local as fast as nhd-order) or DRAM rows (as slow as nhd-shuf),
#     and do touches of the blocks ahead take it back? (s38 built nhd-local
#     and nhd-pf* and never ran them.)
#  2. Where the LSE's last 0.02-0.08 us lie with the pointer null:
#     `bench --grid small` alternated six rounds over old (85c7b88, before
#     the LSE), main, vR (main, its reducers' LSE stores removed) and vD
#     (main, the decode CTAs' lone-split LSE store removed).
# Stage main (`gpu-stage --peers --bin decode-attn`); copy this file,
# ../s36/table-h200.sh and the binaries decode-attn-{85c7b88,vR,vD} into
# .gpu/bin; carry .gpu; run `bash .gpu/call2.sh`. Results: $OUT/c2.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c2; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c2.tgz -C $OUT c2; }
nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/layout kernels/cuda/probe/layout_probe.cu > $R/layout-build.log 2>&1; step build $?
timeout 240 /tmp/layout 3 0xfc3 > $R/layout.txt 2>&1; step layout $?
cat $R/layout.txt
for round in 1 2 3 4 5 6; do
  for v in old main vR vD; do
    b=.gpu/bin/decode-attn-$v; [ $v = main ] && b=.gpu/bin/decode-attn; [ $v = old ] && b=.gpu/bin/decode-attn-85c7b88
    timeout 40 $b bench --backend cuda --csv $R/$v-r$round.csv > $R/$v-r$round.txt 2>&1; step "$v r$round" $?
  done
done
python3 - $R > $R/summary.txt <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = ["old", "main", "vR", "vD"]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].rsplit("-r", 1)[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(median us of 6; then main's min-max)")
for k in sorted(rows):
    m = rows[k].get("main", [float("nan")])
    print(*k, *(f"{st.median(rows[k].get(v, [float('nan')])):.2f}" for v in vs), f"{min(m):.2f}-{max(m):.2f}")
PY
step summary $?; cat $R/summary.txt
