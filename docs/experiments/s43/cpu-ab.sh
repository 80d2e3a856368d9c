#!/bin/bash
# s43: the CPU backend before (ed3593a, AVX512_BF16 loop) and after the AMX
# path, alternated, on this 2-core machine: `bench --backend cpu`, bf16, B 1
# and 4, s 16384 and 65536, both models. Usage: cpu-ab.sh OLD NEW OUTDIR [ROUNDS]
OLD=$1; NEW=$2; R=$3; ROUNDS=${4:-3}; mkdir -p $R
args="bench --backend cpu --model llama3-8b,llama3-70b-tp8 --batch 1,4 --seq-len 16384,65536"
for round in $(seq 1 $ROUNDS); do
  $OLD $args --csv $R/old-r$round.csv > $R/old-r$round.txt 2>&1
  $NEW $args --csv $R/new-r$round.csv > $R/new-r$round.txt 2>&1
done
python3 - $R <<'PY'
import csv, glob, sys, statistics as st
R = sys.argv[1]; rows = {}
for f in sorted(glob.glob(R + "/*-r*.csv")):
    v = f.split("/")[-1].split("-r")[0]
    for r in csv.DictReader(open(f)):
        rows.setdefault((r["model"], int(r["B"]), int(r["s"])), {}).setdefault(v, []).append(float(r["pct_copy"]))
print(f"{'model':16} {'B':>2} {'s':>6}  old %copy (runs)          new %copy (runs)          median new/old")
for k in sorted(rows):
    o, n = rows[k].get("old", []), rows[k].get("new", [])
    fmt = lambda xs: " ".join(f"{x:5.1f}" for x in xs)
    print(f"{k[0]:16} {k[1]:2} {k[2]:6}  {fmt(o):24}  {fmt(n):24}  {st.median(n)/st.median(o):.2f}x")
PY
