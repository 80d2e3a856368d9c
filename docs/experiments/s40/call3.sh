#!/bin/bash
# s40 call 3: does an L2 prefetch of the tiles beyond the copies help the
# real calls? s38's l2-prefetch.patch (each lane asks L2 for one 256-byte row
# of the tile DA_L2_PREFETCH_STEPS = 2 steps beyond the cp.async pipeline,
# sm_90 only) built into a whole binary (.gpu/bin/decode-attn-pf2, a
# worktree of main with the patch), against main's binary: `bench` on the
# shapes of B <= 4, s >= 16384 (KV of 64 MiB or more but 70B B=1 s=16384),
# alternated (main, pf2) while time lasts. Copy this file and the pf2 binary
# into .gpu; carry .gpu; run as `bash .gpu/call3.sh`. Results: $OUT/c3.tgz.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; R=$OUT/c3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
t0=$(date +%s); CAP=${CAP:-400}
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a $R/progress.txt; tar czf $OUT/c3.tgz -C $OUT c3; }
ARGS="--backend cuda --batch 1,4 --seq-len 16384,65536"
for round in 1 2 3; do for b in main pf2; do
  [ $(( $(date +%s) - t0 )) -gt $(( CAP - 70 )) ] && break 2
  bin=.gpu/bin/decode-attn; [ $b = pf2 ] && bin=.gpu/bin/decode-attn-pf2
  timeout 90 $bin bench $ARGS --csv $R/$b-r$round.csv > $R/$b-r$round.txt 2>&1; step "$b r$round" $?
done; done
python3 - $R <<'PY'
import csv, glob, sys, statistics as st
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/*-r*.csv")):
    b = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(b, []).append(float(r["us"]))
print("model B s main_us pf2_us pf2/main (medians)")
for k in sorted(rows):
    m, p = rows[k].get("main", []), rows[k].get("pf2", [])
    if m and p: print(*k, f"{st.median(m):.2f} {st.median(p):.2f} {st.median(p)/st.median(m):.3f}")
PY
