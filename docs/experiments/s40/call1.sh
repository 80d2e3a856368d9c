#!/bin/bash
# s40 call 1: main's kernels on a GPU for the first time since the LSE
# (0fa9072), in the order that matters if time runs out:
# 1. the conformance sweep, the default kernels and the kv-head-grid one
#    (LSE checked on every case);
# 2. the LSE's cost: `bench --grid small` (B 1/4, s 1024/4096, both models:
#    the calls where an epilogue weighs most) with 85c7b88's binary (before
#    the LSE), main's, and main's with `--lse` (the LSE written), alternated
#    three times;
# 3. call3.sh (the L2 prefetch build against main), two rounds;
# 4. the staged test binaries but `binary` (it runs cargo), in the time left.
# Stage main (`gpu-stage --peers --bin decode-attn`), copy this file,
# call3.sh, the old binary (.gpu/bin/decode-attn-85c7b88) and the pf2 one
# into .gpu; carry .gpu; run as `bash .gpu/call1.sh`. Results: $OUT/c1.tgz
# (and c3.tgz), saved after each step.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c1; mkdir -p $R/tests
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s); CAP=${CAP:-560}
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c1.tgz -C $OUT c1; }
timeout 60 .gpu/bin/decode-attn check --backend cuda > $R/check.log 2>&1; step check $?; tail -2 $R/check.log
DECODE_ATTN_CUDA_KERNEL=kvgrid timeout 90 .gpu/bin/decode-attn check --backend cuda > $R/check-kvgrid.log 2>&1; step check-kvgrid $?; tail -2 $R/check-kvgrid.log
for round in 1 2 3; do
  timeout 60 .gpu/bin/decode-attn-85c7b88 bench --backend cuda --csv $R/old-r$round.csv > $R/old-r$round.txt 2>&1; step "old r$round" $?
  timeout 60 .gpu/bin/decode-attn bench --backend cuda --csv $R/new-r$round.csv > $R/new-r$round.txt 2>&1; step "new r$round" $?
  timeout 60 .gpu/bin/decode-attn bench --backend cuda --lse --csv $R/lse-r$round.csv > $R/lse-r$round.txt 2>&1; step "lse r$round" $?
done
cat $R/lse-r1.txt
python3 - $R <<'PY'
import csv, glob, sys, statistics as st
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s old new lse (median us) new/old lse/new")
for k in sorted(rows):
    o, n, l = (st.median(rows[k].get(b, [float("nan")])) for b in ("old", "new", "lse"))
    print(*k, f"{o:.2f} {n:.2f} {l:.2f} {n/o:.3f} {l/n:.3f}")
PY
left=$(( CAP - $(date +%s) + t0 ))
CAP=$(( left > 200 ? 200 : left )) bash .gpu/call3.sh
for t in .gpu/tests/*; do
  left=$(( CAP - $(date +%s) + t0 )); [ $left -lt 20 ] && break
  name=$(basename $t)
  timeout $(( left < 150 ? left : 150 )) $t --test-threads=1 > $R/tests/$name.log 2>&1; step "test $name" $?
  grep -E "^test result|FAILED|panicked" $R/tests/$name.log | head -8
done
