#!/usr/bin/env python3
"""Reads plan-bandwidth.sh's runs: per shape, the splits and µs of the
device's own plan and of the H200 figure's, each the mean of its two runs,
and the ratio, for the shapes whose splits differ. Usage: plan_bandwidth.py DIR."""
import sys


def rows(path):
    out = {}
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        f = line.split()
        if len(f) >= 11 and f[3] == "cuda":
            out[(f[0], int(f[1]), int(f[2]))] = (int(f[5]), float(f[6]))
    return out


d = sys.argv[1]
runs = {name: rows(f"{d}/{name}.txt") for name in ("own", "own-again", "h200", "h200-again")}
print(f"{'model':16} {'B':>3} {'s':>6} {'own splits':>10} {'own us':>9} {'h200 splits':>11} {'h200 us':>9} {'h200/own':>8} {'drift':>6}")
for key in sorted(runs["own"]):
    own = [runs[n][key][1] for n in ("own", "own-again") if key in runs[n]]
    h200 = [runs[n][key][1] for n in ("h200", "h200-again") if key in runs[n]]
    if not h200 or key not in runs["h200"]:
        continue
    own_splits, h200_splits = runs["own"][key][0], runs["h200"][key][0]
    mark = "" if own_splits != h200_splits else "  (same plan)"
    drift = f"{own[1] / own[0]:.3f}" if len(own) == 2 else "-"
    mean_own, mean_h200 = sum(own) / len(own), sum(h200) / len(h200)
    print(f"{key[0]:16} {key[1]:>3} {key[2]:>6} {own_splits:>10} {mean_own:>9.2f} {h200_splits:>11} {mean_h200:>9.2f} "
          f"{mean_h200 / mean_own:>8.3f} {drift:>6}{mark}")
