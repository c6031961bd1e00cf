#!/usr/bin/env python3
"""Where one kernel's warps stall, from Nsight Compute's per-SASS-line source counters.

Input: the CSV that `ncu --import REP --page source --csv --print-source sass` writes (what
scripts/gpu-profile-sass.sh leaves as $OUT/sass-QUANT.csv). Prints the stall samples by opcode,
the hottest lines with their instruction text, and the samples between the first and the last
cell instruction (IMMA/HMMA, or IDP for the streamed step's sm_90 dp4a cells: a GEMV's cell
loop) against the whole kernel; where the CSV has per-reason stall columns, the kernel's and the
cell region's samples by reason.

    python3 scripts/sass_hotspots.py out/sass-int4-a8.csv [--top 40]
"""
import csv
import sys
from collections import defaultdict


def column(header, *needles):
    """Index of the first column whose name contains every needle (case-insensitive)."""
    for i, name in enumerate(header):
        low = name.lower()
        if all(n.lower() in low for n in needles):
            return i
    return None


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    top = 40
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i:i + 2]
    rows = list(csv.reader(open(args[0], newline="")))
    # ncu prints its own lines before the table: the header is the first row naming "Source".
    start = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if start is None:
        sys.exit(f"{args[0]}: no 'Source' column (not ncu's --page source --csv output?)")
    header, body = rows[start], rows[start + 1:]
    src = header.index(next(c for c in header if c.strip() == "Source"))
    addr = column(header, "address")
    samp = column(header, "warp stall sampling", "all") or column(header, "sampling")
    execd = column(header, "instructions executed")
    if samp is None:
        sys.exit(f"no stall-sampling column among: {header}")
    # Per-reason stall columns (their names carry "stall" but are not the sampling totals).
    reasons = [i for i, name in enumerate(header)
               if "stall" in name.lower() and "sampling" not in name.lower()]
    lines, by_reason = [], []
    for r in body:
        if len(r) <= max(src, samp):
            continue
        text = r[src].strip()
        lines.append((r[addr] if addr is not None else "", text, number(r[samp]),
                      number(r[execd]) if execd is not None and execd < len(r) else 0.0))
        by_reason.append([number(r[i]) if i < len(r) else 0.0 for i in reasons])
    total = sum(s for _, _, s, _ in lines) or 1.0
    print(f"{len(lines)} SASS lines, {total:.0f} stall samples")
    by_op = defaultdict(float)
    for _, text, s, _ in lines:
        op = text.split()[0] if text else "?"
        if op.startswith("@"):  # predicated: the opcode follows the predicate
            op = text.split()[1] if len(text.split()) > 1 else op
        by_op[op.split(".")[0]] += s
    print("by opcode: " + ", ".join(f"{op} {100 * s / total:.1f}%"
                                     for op, s in sorted(by_op.items(), key=lambda kv: -kv[1])[:16]))
    def reason_split(rows, what):
        sums = [sum(r[j] for r in rows) for j in range(len(reasons))]
        t = sum(sums) or 1.0
        order = sorted(range(len(reasons)), key=lambda j: -sums[j])
        print(f"{what} by reason: " + ", ".join(
            f"{header[reasons[j]].strip()} {100 * sums[j] / t:.1f}%" for j in order if sums[j] > 0))

    if reasons:
        reason_split(by_reason, "kernel")
    cells = [i for i, (_, text, _, _) in enumerate(lines)
             if any(op in text for op in ("IMMA", "HMMA", "IDP"))]
    if cells:
        a, b = cells[0], cells[-1]
        s = sum(x[2] for x in lines[a:b + 1])
        print(f"lines {a}-{b} (first to last cell instruction, IMMA/HMMA/IDP, {len(cells)} of them): "
              f"{100 * s / total:.1f}% of the samples")
        if reasons:
            reason_split(by_reason[a:b + 1], "cell region")
    print(f"{'line':>6} {'address':>10} {'samples':>8} {'%':>6} {'executed':>10}  instruction")
    for i, (ad, text, s, e) in sorted(enumerate(lines), key=lambda kv: -kv[1][2])[:top]:
        print(f"{i:>6} {ad:>10} {s:>8.0f} {100 * s / total:>6.2f} {e:>10.0f}  {text}")


if __name__ == "__main__":
    main()
