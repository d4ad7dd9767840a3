#!/usr/bin/env python3
"""timeline.py FILE.ctxN [--launches] — where one decode token's time goes inside the CUDA graph.

Reads the per-CTA records a MUSER_CUDA_TIMELINE build of `muser bench` writes (src/cuda/timeline.cuh:
tag, SM, CTA, grid, start, wait-returned, end; %globaltimer ns). Records are in CTA start order and a
launch's CTAs are contiguous (load() says how branches are handled). Per
launch: span = first CTA start .. last CTA end; step = this launch's end - the latest end before it
(its share of the token's critical path; 0 for a graph branch that ends inside another); release = its
first return from griddepcontrol.wait - that latest end (how long after the producer finished the
consumer got going); spread = last CTA end - median CTA end (the imbalance tail). Families are
(kernel, grid); launches on parallel branches are ordered by their first CTA."""
import statistics
import struct
import sys
from collections import OrderedDict, defaultdict

TAGS = {1: "embed", 2: "mmq", 3: "mmq_pair", 4: "mmq_prep", 5: "mmq6", 6: "mmq6_prep", 7: "rope", 8: "att_split",
        9: "att_split_tc", 10: "att_combine", 11: "tail", 12: "argmax", 13: "mvq", 14: "mvq_prep"}
REC = struct.Struct("<HHIIIQII")


def load(path):
    """Launches in order of their first CTA. A launch's CTAs are contiguous in start order, except
    where two graph branches run at once: a record joins the open launch of its (kernel, grid)."""
    data = open(path, "rb").read()
    recs = [REC.unpack_from(data, o) for o in range(0, len(data) - REC.size + 1, REC.size)]
    launches, open_ = [], {}
    for i, r in enumerate(recs):
        key = (r[0], r[3])
        if r[3] == 0:
            sys.exit(f"{path}: record {i}: grid 0")
        cur = open_.get(key)
        if cur is None or len(cur) == key[1]:
            cur = []
            launches.append(cur)
            open_[key] = cur
        cur.append(r)
    for grp in launches:
        if len(grp) != grp[0][3]:
            sys.exit(f"{path}: a launch of {TAGS.get(grp[0][0], grp[0][0])} x{grp[0][3]} has {len(grp)} CTAs")
    return launches


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    launches = load(sys.argv[1])
    t_first = min(r[5] for r in launches[0])
    fam = OrderedDict()
    prev_end = None
    rows = []
    for grp in launches:
        tag, grid = grp[0][0], grp[0][3]
        start = min(r[5] for r in grp)
        ends = sorted(r[5] + r[7] for r in grp)
        end = ends[-1]
        waits = [r[5] + r[6] for r in grp if r[6]]
        wret = min(waits) if waits else start
        step = max(0, end - prev_end) if prev_end is not None else end - start
        rel = wret - prev_end if prev_end is not None else 0
        spread = end - ends[len(ends) // 2]
        key = f"{TAGS.get(tag, tag)} x{grid}"
        rows.append((key, start - t_first, end - t_first, step, rel, spread, len({r[1] for r in grp})))
        f = fam.setdefault(key, defaultdict(list))
        f["step"].append(step)
        f["span"].append(end - start)
        f["rel"].append(rel)
        f["spread"].append(spread)
        f["cta"].append(statistics.median(r[7] for r in grp))
        prev_end = end if prev_end is None else max(prev_end, end)
    total = rows[-1][2]
    print(f"{sys.argv[1]}: {len(launches)} launches, {sum(len(g) for g in launches)} CTAs, token {total / 1e3:.1f} us "
          f"(first CTA start to last CTA end)")
    print(f"{'family':<22}{'n':>5}{'sum step us':>13}{'%':>7}{'step':>8}{'span':>8}{'release':>9}{'spread':>8}{'CTA med':>9}")
    for key, f in sorted(fam.items(), key=lambda kv: -sum(kv[1]["step"])):
        n = len(f["step"])
        s = sum(f["step"])
        print(f"{key:<22}{n:>5}{s / 1e3:>13.1f}{100 * s / total:>7.1f}{s / n / 1e3:>8.2f}"
              f"{statistics.mean(f['span']) / 1e3:>8.2f}{statistics.mean(f['rel']) / 1e3:>9.2f}"
              f"{statistics.mean(f['spread']) / 1e3:>8.2f}{statistics.mean(f['cta']) / 1e3:>9.2f}")
    print("(us per launch: step = end - previous end; span = first start .. last end; release = first wait "
          "return - previous end; spread = last - median CTA end; CTA med = median CTA duration)")
    if "--launches" in sys.argv:
        for key, st, en, step, rel, spread, nsm in rows:
            print(f"{st / 1e3:10.2f} {en / 1e3:10.2f}  {key:<22} step {step / 1e3:6.2f} release {rel / 1e3:6.2f} "
                  f"spread {spread / 1e3:6.2f} SMs {nsm}")


if __name__ == "__main__":
    main()
