"""Reads run-call2.sh's CSVs (DIR/eq-RUN-MODEL.csv) and prints, per model
and shape, each run's microseconds over the mean of main-off and
main-off-again, with the drift between those two. Usage: ratios.py DIR"""
import csv, glob, os, sys
from collections import defaultdict

runs = defaultdict(dict)  # model -> run -> {(B, s): us}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "eq-*.csv"))):
    name = os.path.basename(path)[3:-4]
    for r in csv.DictReader(open(path)):
        run = name[: -len(r["model"]) - 1]
        runs[r["model"]].setdefault(run, {})[(int(r["B"]), int(r["s"]))] = float(r["us"])
order = ["main-always", "e10-always", "main-batch", "e10-batch"]
for model, by_run in runs.items():
    off, again = by_run.get("main-off", {}), by_run.get("main-off-again", {})
    print(f"{model}: us of each run / mean of off and off-again (drift = off-again / off)")
    print(f"{'B':>4} {'s':>6} {'off us':>8} {'drift':>6} " + " ".join(f"{r:>11}" for r in order))
    for key in sorted(off):
        base = (off[key] + again.get(key, off[key])) / 2
        cells = [f"{by_run.get(r, {}).get(key, float('nan')) / base:11.3f}" for r in order]
        drift = again.get(key, float("nan")) / off[key]
        print(f"{key[0]:>4} {key[1]:>6} {base:8.2f} {drift:6.3f} " + " ".join(cells))
