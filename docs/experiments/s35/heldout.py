#!/usr/bin/env python3
"""Reads packing-heldout.sh's logs: per batch, auto and always over off, and whether s35's rule packs it. Usage: heldout.py DIR."""
import re,sys,math
def parse(path):
    out={};label=None
    for line in open(path):
        m=re.match(r"# \S+ ragged batch (\S+):",line)
        if m: label=m.group(1); continue
        m=re.match(r"#   \S+: (\d+) of the (\d+) x (\d+) \(sequence, split\) pairs active; ([\d.]+) empty",line)
        if m and label: out.setdefault(label,{}).update(P=int(m[1]),B=int(m[2]),S=int(m[3]),r=float(m[4])); continue
        f=line.split()
        if label and len(f)>=11 and f[3]=='cuda': out.setdefault(label,{}).update(us=float(f[6]),relerr=f[9])
    return out
d=sys.argv[1]
gms={}
for model in ['llama3-70b-tp8','llama3-8b']:
    off,auto,al=[parse(f'{d}/{model}-{x}.txt') for x in ('off','auto','always')]
    print(model)
    ra=[];rl=[];ro=[]
    for k,v in off.items():
        if k not in auto or k not in al: continue
        r=v.get('r',0.0); B=v['B']
        # The note prints the ratio rounded: at 2.0 the rule's side is read
        # from auto's time, nearer always's (packed) or off's (plain).
        rule = abs(auto[k]['us'] - al[k]['us']) < abs(auto[k]['us'] - v['us']) if abs(r - (2 if B >= 64 else 8)) < 0.05 else r >= (2 if B >= 64 else 8)
        a=auto[k]['us']/v['us']; l=al[k]['us']/v['us']; ra.append(a); rl.append(l); ro.append(l if rule else 1.0)
        print(f"  {k:22} B={B:3} e/a={r:5.1f} off {v['us']:8.2f} auto {auto[k]['us']:8.2f} always {al[k]['us']:8.2f}  auto/off {a:.3f} always/off {l:.3f} auto_packs={rule} relerr {auto[k]['relerr']}")
    g=lambda xs: math.exp(sum(map(math.log,xs))/len(xs))
    print(f"  gm auto/off {g(ra):.3f} (worst {max(ra):.3f}); always/off {g(rl):.3f} (worst {max(rl):.3f}); rule from always/off {g(ro):.3f}; n={len(ra)}")
