#!/usr/bin/env python3
"""bench-compare.py — two builds of peerlink-bench run alternately, compared by their medians.

usage: Hardware/bench-compare.py [--runs N] [--only NAMES] [--encryption required|none]
                                 BEFORE AFTER [-- MORE BENCH ARGUMENTS]

BEFORE and AFTER are two peerlink-bench binaries (copy each release build aside, e.g.
`cp .build/release/peerlink-bench /tmp/bench-before`). Each is run N times (default 6),
alternately, with `--json` and the given `--only` / `--encryption`; the table gives each row's
median and range for both and the ratio of the medians (AFTER / BEFORE). On a shared machine one
run of the same build can differ from the next by 30 %: alternating spreads the machine's moods
over both builds, and an A/A comparison (the same binary twice) shows how far apart two medians
of identical code fall on the day. Loopback only, like the benchmark; every run is bounded by a
time limit (300 s).
"""
import argparse
import json
import statistics
import subprocess
import sys


def run_once(binary, extra):
    try:
        out = subprocess.run([binary, "--json", *extra], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        sys.exit(f"bench-compare: could not run {binary}: {error}")
    if out.returncode != 0:
        sys.exit(f"bench-compare: {binary} failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    rows = json.loads(out.stdout)["rows"]
    return {(r["measurement"], r["encryption"]): (r["value"], r["unit"]) for r in rows if r["measurement"] != "rss_peak"}


def scale(unit, median):
    """The divisor and the unit text that suit a row, chosen from its median."""
    if unit == "s":
        return (1e-6, "µs") if median < 1e-3 else (1e-3, "ms")
    if unit == "msg/s":
        return 1e3, "k msg/s"
    return 1e6, "MB/s"


def cell(values, unit):
    if not values:
        return "-"
    median = statistics.median(values)
    divisor, text = scale(unit, median)
    digits = 1 if median / divisor < 10 else 0
    return f"{median / divisor:.{digits}f} ({min(values) / divisor:.{digits}f}–{max(values) / divisor:.{digits}f}) {text}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--only")
    parser.add_argument("--encryption", choices=["required", "none"])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("more", nargs="*")
    args = parser.parse_args()
    if args.runs < 1 or args.runs > 50:
        sys.exit("bench-compare: --runs takes 1 to 50")
    extra = list(args.more)
    if args.only:
        extra += ["--only", args.only]
    if args.encryption:
        extra += ["--encryption", args.encryption]
    samples = {}  # (measurement, encryption) -> {"before": [...], "after": [...]}, unit
    units = {}
    for index in range(args.runs):
        for label, binary in (("before", args.before), ("after", args.after)):
            for key, (value, unit) in run_once(binary, extra).items():
                samples.setdefault(key, {"before": [], "after": []})[label].append(value)
                units[key] = unit
        print(f"bench-compare: run {index + 1} of {args.runs} done", file=sys.stderr)
    print(f"{'measurement':<28} {'before (median, range)':<34} {'after (median, range)':<34} after/before")
    for key, both in samples.items():
        name = f"{key[0]} ({key[1] or '-'})"
        cells = [cell(both[label], units[key]) for label in ("before", "after")]
        ratio = (statistics.median(both["after"]) / statistics.median(both["before"])
                 if both["before"] and both["after"] else float("nan"))
        print(f"{name:<28} {cells[0]:<34} {cells[1]:<34} {ratio:.2f}")


if __name__ == "__main__":
    main()
