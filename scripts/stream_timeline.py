#!/usr/bin/env python3
"""Where the streamed step's time goes, from every SM's view.

Input: the dump of one profiled step of a build with SS_TIMELINE=1 (kernels/stream_step.cu),
written by `profile_step` when HAYAI_STREAM_TIMELINE=FILE is set (FILE: raw u64 stamps,
FILE.json: their layout). Example, on the GPU machine:

    HAYAI_STREAM_TIMELINE=$OUT/tl.bin .gpu/gpu_check_tl bench-stream
    python3 scripts/stream_timeline.py $OUT/tl.bin
    python3 scripts/stream_timeline.py --compare $OUT/tl0.bin $OUT/tl1.bin   # two builds' tables

Per operation (summed over layers by label) the step's critical path is split at the SM that
published last: the link (the previous operation's last publication to that SM's start), its
prologue (start to quantized input, GEMVs only), its work, and how much of the work its ring
made it wait (the last chunk holding its cells landed after its input was ready). Times in ms.
Then every SM's GEMV cells and store phases (µs), and the links from every SM's view (µs): when
SMs were ready and began waiting after the previous operation's last publication, and how long
each took from its own publication to its next wait.
"""
import contextlib
import io
import json
import struct
import sys
from collections import OrderedDict
from statistics import median


def pct_us(v, f):
    """The f-quantile of nanosecond values v (sorted), in µs."""
    return v[min(len(v) - 1, int(f * len(v)))] * 1e-3


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    report(sys.argv[1])


# The tables `compare` sets side by side: title -> (first column, numeric columns).
COMPARED = OrderedDict([
    ("operation", ["span", "link", "first", "prolog", "work", "ring", "skew"]),
    ("GEMV (last SM)", ["inputs", "resid", "norm", "quant", "cells", "store"]),
    ("GEMV residual (last SM)", ["landed", "sum", "add"]),
    ("GEMV (every SM, us)", ["cells p50", "p90", "store p50", "p90"]),
])


def tables(text):
    """The COMPARED tables of a report: title -> label -> values, and the step's ms."""
    out, title, step = OrderedDict(), None, None
    for line in text.splitlines():
        if line.startswith("step (SM views):"):
            step = float(line.split()[3])
            continue
        head = next((t for t in COMPARED if line.startswith(t)), None)
        if head is not None and line[len(head):].split()[:1] in (["n"], ["n", "inputs"]):
            title = head
            out[title] = OrderedDict()
            continue
        parts = line.split()
        if title is None or len(parts) < 2 + len(COMPARED[title]) or not parts[1].isdigit():
            title = None
            continue
        try:
            out[title][parts[0]] = [float(x) for x in parts[2:2 + len(COMPARED[title])]]
        except ValueError:
            title = None
    return out, step


def compare(path_a, path_b):
    """Two timelines' main tables side by side: B's value and B - A, by operation."""
    runs = []
    for path in (path_a, path_b):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            report(path)
        runs.append(tables(buf.getvalue()))
    (ta, sa), (tb, sb) = runs
    print(f"step (SM views): A {sa:.3f} ms ({path_a}), B {sb:.3f} ms ({path_b}); each value: B (B - A)")
    for title, cols in COMPARED.items():
        if title not in ta or title not in tb:
            continue
        print(f"{title:<28}" + "".join(f"{c:>17}" for c in cols))
        for label, vb in tb[title].items():
            va = ta[title].get(label)
            if va is None:
                continue
            print(f"{label:<28}" + "".join(f"{b:9.3f} ({b - a:+.3f})" for a, b in zip(va, vb)))


def report(path):
    """The report of one timeline dump (stdout)."""
    meta = json.load(open(path + ".json"))
    raw = open(path, "rb").read()
    w = struct.unpack("<%dQ" % (len(raw) // 8), raw)
    n, nsm, S, TLC, CC = meta["n_ops"], meta["n_sm"], meta["stamps"], meta["tl_chunks"], meta["chunk_cells"]
    SL = meta.get("tl_slots", 4)
    A = n * S
    B = A + nsm * n * SL

    def op(s, k, i):
        return w[A + (s * n + k) * SL + i]

    def chunk(s, c, i):
        return w[B + (s * TLC + c) * 2 + i] if c < TLC else 0

    if not any(op(s, k, 3) for s in range(nsm) for k in range(n)):
        sys.exit("no per-SM stamps: was the binary built with HAYAI_CUDA_DEFINES=-DSS_TIMELINE=1?")
    t0 = min(op(s, 0, 1) for s in range(nsm))
    # GEMV operations and their streams (one each; the int8 output head's kernel is gemv_q8).
    GEMVS = {"gemv": 1, "gemv_q8": 1}
    gi, gemv_of = 0, {}
    for k, (kernel, _) in enumerate(meta["ops"]):
        if kernel in GEMVS:
            gemv_of[k] = gi
            gi += GEMVS[kernel]

    def cells_of(k, s):
        """SM s's [first, end) cells of operation k's streams."""
        first = meta["gemv_cells"][gemv_of[k]][s][0]
        last = meta["gemv_cells"][gemv_of[k] + GEMVS[meta["ops"][k][0]] - 1][s][1]
        return first, last
    def busy_sms(k):
        """The SMs with work in operation k (a GEMV's SMs without cells are done at once: the
        PLE gate has cells on 64 of 132 SMs); every SM if none."""
        kernel = meta["ops"][k][0]
        if kernel not in GEMVS:
            return list(range(nsm))
        cells = [cells_of(k, s) for s in range(nsm)]
        return [s for s in range(nsm) if cells[s][1] > cells[s][0]] or list(range(nsm))

    rows = OrderedDict()
    crit_count = [0] * nsm
    prev_last = t0
    for k, (kernel, label) in enumerate(meta["ops"]):
        done = [op(s, k, 3) for s in range(nsm)]
        crit = max(range(nsm), key=lambda s: done[s])
        crit_count[crit] += 1
        ready, quant = op(crit, k, 1), op(crit, k, 2)
        link = max(0, ready - prev_last)
        prologue = max(0, quant - ready) if kernel in GEMVS and quant else 0
        work = done[crit] - (quant if prologue else ready)
        ring = 0
        if kernel in GEMVS:
            c0, c1 = cells_of(k, crit)
            if c1 > c0:
                landed = chunk(crit, (c1 - 1) // CC, 1)
                start = quant if prologue else ready
                ring = max(0, min(landed, done[crit]) - start) if landed else 0
        earliest_ready = min(op(s, k, 1) for s in range(nsm))
        r = rows.setdefault(label, [0, 0, 0, 0, 0, 0, 0, 0])
        r[0] += 1
        r[1] += done[crit] - prev_last
        r[2] += link
        r[3] += prologue
        r[4] += work
        r[5] += ring
        # Skew against the median SM that had work in it.
        r[6] += done[crit] - median(done[s] for s in busy_sms(k))
        r[7] += max(0, earliest_ready - prev_last)
        prev_last = done[crit]
    total = prev_last - t0
    print(f"step (SM views): {total * 1e-6:.3f} ms over {n} operations on {nsm} SMs")
    print(f"{'operation':<28}{'n':>4}{'span':>8}{'link':>8}{'first':>8}{'prolog':>8}{'work':>8}{'ring':>8}{'skew':>8}")
    for label, r in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        ms = [x * 1e-6 for x in r[1:]]
        print(f"{label:<28}{r[0]:>4}{ms[0]:8.3f}{ms[1]:8.3f}{ms[6]:8.3f}{ms[2]:8.3f}{ms[3]:8.3f}{ms[4]:8.3f}{ms[5]:8.3f}")
    print("span: previous operation's last publication to this one's; link: to the last SM's start;"
          " first: to the first SM's start; prolog/work: the last SM's; ring: of its work, waiting"
          " for its last chunk; skew: the last SM's done minus the median busy SM's")
    if SL >= 8:
        # The GEMV prologue's phases on the SM that published last: inputs loaded, residual
        # added, norm (to the prologue's end), quantized; then its cells and the rest.
        sub = OrderedDict()
        prev_last = t0
        for k, (kernel, label) in enumerate(meta["ops"]):
            done = [op(s, k, 3) for s in range(nsm)]
            crit = max(range(nsm), key=lambda s: done[s])
            if kernel in GEMVS and op(crit, k, 2):
                st = [op(crit, k, i) for i in (1, 4, 5, 6, 2, 7, 3)]
                r = sub.setdefault(label, [0] * 7)
                r[0] += 1
                for i in range(6):
                    r[i + 1] += max(0, st[i + 1] - st[i])
            prev_last = done[crit]
        print(f"{'GEMV (last SM)':<28}{'n':>4}{'inputs':>8}{'resid':>8}{'norm':>8}{'quant':>8}{'cells':>8}{'store':>8}")
        for label, r in sorted(sub.items(), key=lambda kv: -sum(kv[1][1:5])):
            ms = [x * 1e-6 for x in r[1:]]
            print(f"{label:<28}{r[0]:>4}" + "".join(f"{x:8.3f}" for x in ms))
    if SL >= 10:
        # The residual phase split (GEMVs with a residual input): inputs loaded -> residual input
        # landed (its cp.async and the norm weights') -> the residual's norm summed -> added.
        res = OrderedDict()
        for k, (kernel, label) in enumerate(meta["ops"]):
            done = [op(s, k, 3) for s in range(nsm)]
            crit = max(range(nsm), key=lambda s: done[s])
            st = [op(crit, k, i) for i in (4, 8, 9, 5)]
            if kernel in GEMVS and op(crit, k, 2) and all(st) and st[2] > st[1]:
                r = res.setdefault(label, [0] * 4)
                r[0] += 1
                for i in range(3):
                    r[i + 1] += max(0, st[i + 1] - st[i])
        if res:
            print(f"{'GEMV residual (last SM)':<28}{'n':>4}{'landed':>8}{'sum':>8}{'add':>8}")
            for label, r in res.items():
                ms = [x * 1e-6 for x in r[1:]]
                print(f"{label:<28}{r[0]:>4}" + "".join(f"{x:8.3f}" for x in ms))
        # Every SM's last two GEMV phases (µs, p50 and p90 over SMs and layers): its cells
        # (quantized input to the last pass's barrier) and the rest (its sums stored, the closing
        # barrier). The rest is ~0.26 µs; outstanding cp.async reads on the SM held it back until
        # they landed (twenty-third session, docs/performance.md).
        allsm = OrderedDict()
        for k, (kernel, label) in enumerate(meta["ops"]):
            if kernel not in GEMVS:
                continue
            for s in range(nsm):
                q, c, d = op(s, k, 2), op(s, k, 7), op(s, k, 3)
                if q and c and d and d >= c >= q:
                    v = allsm.setdefault(label, ([], []))
                    v[0].append(c - q)
                    v[1].append(d - c)
        if allsm:
            print(f"{'GEMV (every SM, us)':<28}{'n':>6}{'cells p50':>11}{'p90':>7}{'store p50':>11}{'p90':>7}")
            for label, (cv, sv) in allsm.items():
                cv.sort()
                sv.sort()
                print(f"{label:<28}{len(cv):>6}{pct_us(cv, 0.5):11.2f}{pct_us(cv, 0.9):7.2f}"
                      f"{pct_us(sv, 0.5):11.2f}{pct_us(sv, 0.9):7.2f}")
        # The ring behind each GEMV on the SM that published last (medians over layers): its
        # chunks, how many had landed when its input was quantized, and when (µs after that) the
        # last was issued and landed and the GEMV was done: a chunk can only be issued once the
        # one NCH before it is released, so a GEMV larger than the ring waits at its tail.
        ringv = OrderedDict()
        for k, (kernel, label) in enumerate(meta["ops"]):
            if kernel not in GEMVS:
                continue
            done = [op(s, k, 3) for s in range(nsm)]
            crit = max(range(nsm), key=lambda s: done[s])
            c0, c1 = cells_of(k, crit)
            q = op(crit, k, 2)
            if c1 <= c0 or not q:
                continue
            chs = range(c0 // CC, (c1 - 1) // CC + 1)
            if not all(chunk(crit, c, 0) and chunk(crit, c, 1) for c in chs):
                continue
            # The chunks copied after the input was quantized (issued, landed): each waited for
            # a slot the warps freed, so their spacing is the rate the cells free the ring.
            tail = [(chunk(crit, c, 0) - q, chunk(crit, c, 1) - q) for c in chs if chunk(crit, c, 0) > q]
            ringv.setdefault(label, []).append((len(chs), sum(chunk(crit, c, 1) <= q for c in chs),
                                                chunk(crit, chs[-1], 0) - q, chunk(crit, chs[-1], 1) - q,
                                                done[crit] - q, tail))
        if ringv:
            print(f"{'GEMV ring (last SM, us)':<28}{'n':>4}{'chunks':>8}{'landed':>8}{'issued':>8}"
                  f"{'last':>8}{'done':>8}")
            for label, v in ringv.items():
                m = [median(x[i] for x in v) for i in range(5)]
                print(f"{label:<28}{len(v):>4}{m[0]:8.0f}{m[1]:8.0f}{m[2] * 1e-3:8.2f}{m[3] * 1e-3:8.2f}"
                      f"{m[4] * 1e-3:8.2f}")
            print("landed: chunks landed when its input was quantized; issued / last: its last chunk"
                  " issued / landed; done: its cells stored (µs after the quantized input)")
            for label, v in ringv.items():
                # Layers with the most common number of such chunks, medians chunk by chunk.
                counts = [len(x[5]) for x in v]
                nt = max(set(counts), key=counts.count)
                if nt == 0:
                    continue
                tails = [x[5] for x in v if len(x[5]) == nt]
                cols = "  ".join(f"{median(t[i][0] for t in tails) * 1e-3:.2f}/{median(t[i][1] for t in tails) * 1e-3:.2f}"
                                 for i in range(nt))
                print(f"{label + ' ring tail':<28}{len(tails):>4}  issued/landed (µs): {cols}")
        # Attention's phases on the SM that finished it last (builds that stamp them: slots 4-6
        # = its first item's inputs ready, its items done, every SM's ranges stored).
        att = [0] * 5
        for k, (kernel, label) in enumerate(meta["ops"]):
            if kernel != "attn_split":
                continue
            done = [op(s, k, 3) for s in range(nsm)]
            crit = max(range(nsm), key=lambda s: done[s])
            st = [op(crit, k, i) for i in (1, 4, 5, 6, 3)]
            if all(st):
                att[0] += 1
                for i in range(4):
                    att[i + 1] += max(0, st[i + 1] - st[i])
        if att[0]:
            ms = [x * 1e-6 for x in att[1:]]
            print(f"{'attention (last SM)':<28}{att[0]:>4}  inputs {ms[0]:.3f}  items {ms[1]:.3f}"
                  f"  ranges barrier {ms[2]:.3f}  merge {ms[3]:.3f}")
        # An attention's first item on every SM that has one, phase by phase between slots
        # (each list: µs between consecutive slots, p50 and p90 over SMs and layers).
        def attention_phases(title, slots, names):
            ph = [[] for _ in names]
            for k, (kernel, label) in enumerate(meta["ops"]):
                if kernel != "attn_split":
                    continue
                for s in range(nsm):
                    st = [op(s, k, i) for i in slots]
                    if all(st):
                        for i in range(len(names)):
                            ph[i].append(max(0, st[i + 1] - st[i]))
            if ph[0]:
                print(f"{title:<28}{len(ph[0]):>4}" + "".join(
                    f"  {name} p50 {pct_us(sorted(v), 0.5):.2f} p90 {pct_us(sorted(v), 0.9):.2f}"
                    for name, v in zip(names, ph)))

        # Builds stamping slots 2 and 7 too: ready -> thread 0's q/k/v vector -> every warp's ->
        # the newest row and tile landed.
        attention_phases("attention item inputs (us)", (1, 2, 7, 4), ("q/k/v", "all warps", "row+tile"))
        # Builds that also stamp the first item's start (slot 9) and thread 0's q/k/v partials
        # landed (slot 8): ready -> item begun -> partials landed -> q/k/v vector.
        attention_phases("attention q/k/v (us)", (1, 9, 8, 2), ("to item", "partials", "vector"))
    # The link from every SM's view: per operation (medians over layers, µs after the previous
    # operation's last publication P) when the first, median and last SM were ready, when the
    # last and median SM began waiting, and each SM's own publication to its next wait (what it
    # does between operations: a GEMV's release, an attention's prestage).
    links = OrderedDict()
    for k in range(1, n):
        label = meta["ops"][k][1]
        last_pub = max(op(s, k - 1, 3) for s in range(nsm))
        ready = sorted(op(s, k, 1) - last_pub for s in range(nsm))
        wait = sorted(op(s, k, 0) - last_pub for s in range(nsm))
        own = sorted(op(s, k, 0) - op(s, k - 1, 3) for s in range(nsm))
        links.setdefault(label, []).append(
            (ready[0], median(ready), ready[-1], median(wait), wait[-1], own[0], median(own), own[-1]))
    print(f"{'link (us after P)':<28}{'n':>4}{'ready:':>8}{'first':>6}{'median':>7}{'last':>6}"
          f"{'wait:':>7}{'median':>7}{'last':>6}{'own:':>6}{'min':>6}{'median':>7}{'max':>6}")
    for label, v in links.items():
        m = [median(x[i] for x in v) * 1e-3 for i in range(8)]
        print(f"{label:<28}{len(v):>4}{'':>8}{m[0]:6.2f}{m[1]:7.2f}{m[2]:6.2f}{'':>7}{m[3]:7.2f}{m[4]:6.2f}"
              f"{'':>6}{m[5]:6.2f}{m[6]:7.2f}{m[7]:6.2f}")
    # The skew split: the SM that published last against the median SM with work in it (µs after
    # P, medians over layers): how much later it was ready, and how much longer its work took.
    # (The order by the previous operation's cells was no help: twenty-fourth session.)
    crit_v = OrderedDict()
    for k in range(1, n):
        label = meta["ops"][k][1]
        last_pub = max(op(s, k - 1, 3) for s in range(nsm))
        done = [op(s, k, 3) for s in range(nsm)]
        crit = max(range(nsm), key=lambda s: done[s])
        busy = busy_sms(k)
        crit_v.setdefault(label, []).append((
            op(crit, k, 1) - last_pub, median(op(s, k, 1) - last_pub for s in busy),
            done[crit] - op(crit, k, 1), median(done[s] - op(s, k, 1) for s in busy),
            done[crit] - last_pub, median(done[s] - last_pub for s in busy)))
    print(f"{'last SM / median busy SM':<28}{'n':>4}{'ready: last':>13}{'median':>7}{'work: last':>12}{'median':>7}"
          f"{'done: last':>12}{'median':>7}")
    for label, v in crit_v.items():
        m = [median(x[i] for x in v) * 1e-3 for i in range(6)]
        print(f"{label:<28}{len(v):>4}{m[0]:13.2f}{m[1]:7.2f}{m[2]:12.2f}{m[3]:7.2f}{m[4]:12.2f}{m[5]:7.2f}")
    top = sorted(range(nsm), key=lambda s: -crit_count[s])[:8]
    print("SMs publishing last most often:", ", ".join(f"{s} ({crit_count[s]})" for s in top))
    # The ring: time from issue to landing, and how far ahead of its use the producer ran.
    lat = [chunk(s, c, 1) - chunk(s, c, 0) for s in range(nsm) for c in range(TLC)
           if chunk(s, c, 0) and chunk(s, c, 1)]
    if lat:
        lat.sort()
        q = lambda f: pct_us(lat, f)
        print(f"chunk issue->landed (us): p10 {q(0.1):.2f} p50 {q(0.5):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f}"
              f" ({len(lat)} chunks)")


if __name__ == "__main__":
    main()
