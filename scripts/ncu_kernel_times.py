#!/usr/bin/env python3
"""Sum Nsight Compute's per-launch kernel durations by kernel and grid.

    ncu --clock-control none -k regex:pf_ -c N --metrics gpu__time_duration.sum --csv \
        --log-file OUT.csv  hayai bench-engine ...
    scripts/ncu_kernel_times.py OUT.csv
"""
import collections
import csv
import sys

SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main(path):
    hdr = None
    tot, n = collections.defaultdict(float), collections.Counter()
    for r in csv.reader(open(path)):
        if hdr is None:
            if "Kernel Name" in r:
                hdr = r
            continue
        if len(r) != len(hdr):
            continue
        d = dict(zip(hdr, r))
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        # ncu writes thousands separators ("168,480").
        us = float(d["Metric Value"].replace(",", "")) * SCALE[d.get("Metric Unit", "ns")]
        k = (d["Kernel Name"].split("(")[0], d["Grid Size"])
        tot[k] += us
        n[k] += 1
    print(f"launches {sum(n.values())}, kernel time {sum(tot.values()):.1f} us")
    for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
        print(f"  {k[0]:16} grid {k[1]:14} x{n[k]:4}  {v:9.1f} us  ({v / n[k]:.1f} each)")


if __name__ == "__main__":
    main(sys.argv[1])
