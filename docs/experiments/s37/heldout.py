#!/usr/bin/env python3
"""Reads heldout.sh's runs (DIR/{own,h200}-MODEL-{1,2}.txt, `bench` tables):
per shape, each setting's splits and mean µs over its runs, the ratio
own/h200, and the geometric mean and worst of that ratio over the shapes
whose plans differ. Usage: heldout.py DIR."""
import glob
import math
import os
import sys


def rows(path):
    out = {}
    for line in open(path).read().splitlines():
        f = line.split()
        if len(f) >= 11 and f[3] == "cuda":
            out[(f[0], int(f[1]), int(f[2]))] = (f[5], float(f[6]))
    return out


runs = {"own": {}, "h200": {}}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-*-[12].txt"))):
    setting = os.path.basename(path).split("-", 1)[0]
    if setting in runs:
        for key, (splits, us) in rows(path).items():
            runs[setting].setdefault(key, (splits, []))[1].append(us)
ratios = []
print(f"{'model':16} {'B':>3} {'s':>6} {'own splits':>10} {'own us':>9} {'h200 splits':>11} {'h200 us':>9} {'own/h200':>8}")
for key in sorted(runs["own"]):
    if key not in runs["h200"]:
        continue
    (own_splits, own), (h200_splits, h200) = runs["own"][key], runs["h200"][key]
    mean_own, mean_h200 = sum(own) / len(own), sum(h200) / len(h200)
    ratio = mean_own / mean_h200
    same = own_splits == h200_splits
    if not same:
        ratios.append((ratio, key))
    print(f"{key[0]:16} {key[1]:>3} {key[2]:>6} {own_splits:>10} {mean_own:>9.2f} {h200_splits:>11} {mean_h200:>9.2f} "
          f"{ratio:>8.3f}{'  (same plan)' if same else ''}")
if ratios:
    geo = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
    worst, best = max(ratios), min(ratios)
    print(f"{len(ratios)} shapes planned differently: own/h200 geometric mean {geo:.3f}, "
          f"worst {worst[0]:.3f} {worst[1]}, best {best[0]:.3f} {best[1]}")
