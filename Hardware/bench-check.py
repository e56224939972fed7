#!/usr/bin/env python3
"""bench-check.py — checks a `peerlink-bench --json` object read from standard input.

usage: peerlink-bench --json | Hardware/bench-check.py tcp|bluetooth

The object is {"build", "transport", "rows": [{"measurement", "encryption", "value", "unit",
"baseline"}]}; every measurement of the transport is there, once for each encryption it is
measured with, with its unit, a finite value and (where a raw figure is measured in the same
run) a baseline. Prints a one-line summary; exits 1 with the reasons when something is wrong.
"""
import json
import math
import sys

TCP = {
    # measurement: (unit, has a baseline, encryptions)
    "messages_64B": ("msg/s", True, ("required", "none")),
    "messages_1KiB": ("B/s", True, ("required", "none")),
    "messages_64KiB": ("B/s", True, ("required", "none")),
    "messages_1MiB": ("B/s", True, ("required", "none")),
    "stream": ("B/s", True, ("required", "none")),
    "rtt_p50": ("s", True, ("required", "none")),
    "rtt_p99": ("s", True, ("required", "none")),
    "rtt_p50_under_bulk": ("s", False, ("required", "none")),
    "rtt_p99_under_bulk": ("s", False, ("required", "none")),
    "connect": ("s", False, ("required", "none")),
    "mesh8": ("s", False, ("required",)),
    "aead_limit": ("B/s", False, (None,)),
    "rss_peak": ("B", False, (None,)),
}
BLUETOOTH = {"rss_peak": ("B", False, (None,))}
for kind in ("rfcomm", "l2cap"):
    BLUETOOTH.update({
        f"{kind}_connect": ("s", True, ("required",)),
        f"{kind}_messages_1KiB": ("B/s", True, ("required",)),
        f"{kind}_messages_64KiB": ("B/s", True, ("required",)),
        f"{kind}_stream": ("B/s", True, ("required",)),
        f"{kind}_rtt_p50": ("s", True, ("required",)),
        f"{kind}_rtt_p99": ("s", True, ("required",)),
        f"{kind}_rtt_p50_under_bulk": ("s", False, ("required",)),
        f"{kind}_rtt_p99_under_bulk": ("s", False, ("required",)),
    })


def finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def check(document, transport):
    problems = []
    expected = TCP if transport == "tcp" else BLUETOOTH
    if document.get("build") not in ("release", "debug"):
        problems.append(f"build is {document.get('build')!r}, not release or debug")
    if document.get("transport") != transport:
        problems.append(f"transport is {document.get('transport')!r}, not {transport}")
    rows = document.get("rows")
    if not isinstance(rows, list):
        return problems + ["rows is not a list"]
    seen = {}
    for row in rows:
        if not isinstance(row, dict) or set(row) != {"measurement", "encryption", "value", "unit", "baseline"}:
            problems.append(f"a row without exactly measurement, encryption, value, unit, baseline: {row}")
            continue
        key = (row["measurement"], row["encryption"])
        if key in seen:
            problems.append(f"{key} twice")
        seen[key] = row
        spec = expected.get(row["measurement"])
        if spec is None:
            problems.append(f"unknown measurement {row['measurement']}")
            continue
        unit, has_baseline, encryptions = spec
        if row["encryption"] not in encryptions:
            problems.append(f"{row['measurement']}: encryption {row['encryption']!r}, expected one of {encryptions}")
        if row["unit"] != unit:
            problems.append(f"{row['measurement']}: unit {row['unit']!r}, not {unit}")
        if not finite(row["value"]) or row["value"] == 0:
            problems.append(f"{key}: value {row['value']!r} is not a positive number")
        if has_baseline and (not finite(row["baseline"]) or row["baseline"] == 0):
            problems.append(f"{key}: baseline {row['baseline']!r} is not a positive number")
        if not has_baseline and row["baseline"] is not None:
            problems.append(f"{key}: baseline {row['baseline']!r}, expected null")
    for measurement, (_, _, encryptions) in expected.items():
        for encryption in encryptions:
            if (measurement, encryption) not in seen:
                problems.append(f"missing: {measurement} ({encryption or 'no encryption'})")
    return problems


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("tcp", "bluetooth"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    try:
        document = json.load(sys.stdin)
    except json.JSONDecodeError as error:
        print(f"bench-check: not JSON: {error}", file=sys.stderr)
        return 1
    problems = check(document, sys.argv[1]) if isinstance(document, dict) else ["not a JSON object"]
    for problem in problems:
        print(f"bench-check: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"bench-check: {len(document['rows'])} rows, {document['build']} build, {document['transport']}: as documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
