#!/bin/bash
# s42 call 3, by the GPU that comes. H200: s36's table-h200.sh (main's
# staged binary). An H100: vB, the stream reducer's LSE computed by every
# thread and stored after the barrier by the last one with a predicated
# store (da_store_if), instead of computed and stored by thread 0 behind a
# branch before the barrier (call 2: the reducer's LSE code is most of
# what the LSE still costs with the pointer null):
#  1. `check --backend cuda` on vB, both kernels; memcheck over the first;
#  2. `bench --grid small` alternated six rounds over old (85c7b88), main
#     and vB, then three rounds of main and vB with `--lse`.
# Stage main (`gpu-stage --peers --bin decode-attn`); copy this file,
# ../s36/table-h200.sh and the binaries decode-attn-{85c7b88,vB} into
# .gpu/bin; carry .gpu; run `bash .gpu/call3.sh`. Results: $OUT/c3.tgz.
cd "$(dirname "$0")"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash table-h200.sh; fi
cd ..
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt; cat $R/gpu.txt
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
B=.gpu/bin/decode-attn-vB
timeout 60 $B check --backend cuda > $R/check.log 2>&1; step check $?; tail -1 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 120 $B check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -1 $R/check-kvgrid.log
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B check --backend cuda > $R/memcheck.log 2>&1; step memcheck $?; tail -3 $R/memcheck.log
run() { timeout 40 $2 bench --backend cuda $3 --csv $R/$1.csv > $R/$1.txt 2>&1; step $1 $?; }
for round in 1 2 3 4 5 6; do
  run old-r$round .gpu/bin/decode-attn-85c7b88
  run main-r$round .gpu/bin/decode-attn
  run vB-r$round $B
done
for round in 1 2 3; do
  run mainlse-r$round .gpu/bin/decode-attn --lse
  run vBlse-r$round $B --lse
done
python3 - $R > $R/summary.txt <<'PY'
import csv, glob, sys, statistics as st
rows = {}; vs = ["old", "main", "vB", "mainlse", "vBlse"]
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].rsplit("-r", 1)[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s", *vs, "(medians, us: six rounds, three with --lse; then main's and vB's min-max)")
for k in sorted(rows):
    m, b = rows[k].get("main", [float("nan")]), rows[k].get("vB", [float("nan")])
    print(*k, *(f"{st.median(rows[k].get(v, [float('nan')])):.2f}" for v in vs),
          f"{min(m):.2f}-{max(m):.2f}", f"{min(b):.2f}-{max(b):.2f}")
PY
step summary $?; cat $R/summary.txt
