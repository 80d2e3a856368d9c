#!/bin/bash
# s41 call 5: main after s41's kernel edit (f1954ca), by the GPU that comes.
# H200: s36's table-h200.sh (the issue's grid beside the peers; last run in
# s26). Otherwise: `check` on both kernels, `bench --grid small` with and
# without `--lse` against 85c7b88 alternated three times (does the staged
# main time as call 3's v1 did?), then the test binaries but `binary`.
# Stage main (`gpu-stage --peers --bin decode-attn`), copy this file,
# ../s36/table-h200.sh and 85c7b88's binary (.gpu/bin/decode-attn-85c7b88)
# into .gpu; carry .gpu; run as `bash .gpu/call5.sh`. Results: $OUT/t.tgz
# (table) or $OUT/c5.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c5; mkdir -p $R/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s); CAP=${CAP:-560}
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" >> $R/progress.txt; tar czf $OUT/c5.tgz -C $OUT c5; }
timeout 60 .gpu/bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 120 .gpu/bin/decode-attn check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -1 $R/check-kvgrid.log
for round in 1 2 3; do
  timeout 40 .gpu/bin/decode-attn-85c7b88 bench --backend cuda --csv $R/old-r$round.csv > $R/old-r$round.txt 2>&1; step "old r$round" $?
  timeout 40 .gpu/bin/decode-attn bench --backend cuda --csv $R/main-r$round.csv > $R/main-r$round.txt 2>&1; step "main r$round" $?
  timeout 40 .gpu/bin/decode-attn bench --backend cuda --lse --csv $R/mainlse-r$round.csv > $R/mainlse-r$round.txt 2>&1; step "mainlse r$round" $?
done
python3 - $R <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = ["old", "main", "mainlse"]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].rsplit("-r", 1)[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(median us of 3)")
for k in sorted(rows):
    print(*k, *(f"{st.median(rows[k].get(v, [float('nan')])):.2f}" for v in vs))
PY
for t in $(ls .gpu/tests/* | grep -v '/binary'); do
  left=$(( CAP - $(date +%s) + t0 )); [ $left -lt 20 ] && break
  name=$(basename $t)
  timeout $(( left < 250 ? left : 250 )) $t --test-threads=1 > $R/tests/$name.log 2>&1; step "test $name" $?
  grep -E "^test result|FAILED|panicked" $R/tests/$name.log | head -8
done
