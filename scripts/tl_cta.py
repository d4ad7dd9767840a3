#!/usr/bin/env python3
"""tl_cta.py FILE.ctxN — inside each kernel family of a timeline (scripts/timeline.py's records): when its
CTAs start, get past griddepcontrol.wait and end, relative to the end of the launch before it (the
previous end, as timeline.py's step). Per family, the median over its launches of the 10th / 50th /
90th percentile and the last CTA, in us; a negative start is a CTA resident before its producer ended."""
import statistics
import sys
from collections import OrderedDict, defaultdict

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from timeline import TAGS, load  # noqa: E402


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fam = OrderedDict()
    prev_end = None
    for grp in load(sys.argv[1]):
        end = max(r[5] + r[7] for r in grp)
        if prev_end is not None:
            key = f"{TAGS.get(grp[0][0], grp[0][0])} x{grp[0][3]}"
            f = fam.setdefault(key, defaultdict(list))
            for name, vals in (("start", [r[5] - prev_end for r in grp]),
                               ("wait", [r[5] + r[6] - prev_end for r in grp if r[6]]),
                               ("end", [r[5] + r[7] - prev_end for r in grp]),
                               ("work", [r[7] - r[6] if r[6] else r[7] for r in grp])):
                if vals:
                    f[name].append([pct(vals, 0.1), pct(vals, 0.5), pct(vals, 0.9), max(vals)])
            prev_end = max(prev_end, end)
        else:
            prev_end = end
    print(f"{'family':<20}{'what':>7}{'p10':>8}{'p50':>8}{'p90':>8}{'max':>8}   (us after the previous end; "
          "work = end - wait return per CTA)")
    for key, f in fam.items():
        for name in ("start", "wait", "end", "work"):
            if name in f:
                cols = [statistics.median(x[i] for x in f[name]) / 1e3 for i in range(4)]
                print(f"{key if name == 'start' else '':<20}{name:>7}" + "".join(f"{c:8.2f}" for c in cols))


if __name__ == "__main__":
    main()
