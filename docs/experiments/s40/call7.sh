#!/bin/bash
# s40 call 7: where is the rest of the null-pointer cost (call 6: main with
# da_log2 is still 0.04-0.19 us over 85c7b88)? Four builds, `bench --grid
# small` alternated three times:
#   old      85c7b88
#   log2     main + da_log2 (lg2.approx in the LSE epilogues)
#   noreduce log2 without the stream reducer's two LSE stores
#   nocta    log2 without store_cta_state's LSE block (the decode CTAs')
# Copy this file and the binaries into .gpu; carry .gpu; run as
# `bash .gpu/call7.sh`. Results: $OUT/c7.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c7; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" >> $R/progress.txt; tar czf $OUT/c7.tgz -C $OUT c7; }
vs="old log2 noreduce nocta"
for round in 1 2 3; do for v in $vs; do
  b=.gpu/bin/decode-attn-$v; [ $v = old ] && b=.gpu/bin/decode-attn-85c7b88
  timeout 40 $b bench --backend cuda --csv $R/$v-r$round.csv > $R/$v-r$round.txt 2>&1; step "$v r$round" $?
done; done
python3 - $R $vs <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = sys.argv[2:]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(median us); each over old")
for k in sorted(rows):
    m = {v: st.median(rows[k].get(v, [float("nan")])) for v in vs}
    print(*k, *(f"{m[v]:.2f}" for v in vs), *(f"{m[v]/m['old']:.3f}" for v in vs[1:]))
PY
