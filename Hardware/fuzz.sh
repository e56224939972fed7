#!/usr/bin/env bash
# fuzz.sh — builds the libFuzzer targets (peerlink-fuzz) and runs them.
#
# usage: Hardware/fuzz.sh [--seconds N] [--build-only] [--list] [TARGET...]
#
#   --seconds N    how long each target runs (default 5)
#   --build-only   build, then stop
#   --list         list the targets, then stop
#   TARGET...      the targets to run (default: all of them; see --list)
#
# Builds `swift build -c release --product peerlink-fuzz -Xswiftc -sanitize=fuzzer,address
# -Xswiftc -DPEERLINK_FUZZING` in its own build directory (.build-fuzz, or PEERLINK_FUZZ_SCRATCH_PATH),
# so the normal build never needs libFuzzer. Each target starts from the committed seed corpus
# (Tests/Fuzz/corpus/TARGET, read only) and a working corpus that grows between runs
# (BUILD/fuzz-corpus/TARGET). A crash, leak, timeout (10 s) or memory blow-up (2 GiB) stops that
# target; its input is kept as BUILD/fuzz-artifacts/TARGET-crash-… and the script exits 1.
# Replay an input with the normal build: peerlink-fuzz TARGET FILE.
#
# Prints one line per target (executions, corpus size) and the total number of executions.
# Loopback and network are never touched: the targets only decode bytes.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

seconds=5
build_only=0
list=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
        --build-only) build_only=1; shift ;;
        --list) list=1; shift ;;
        -*) echo "fuzz: unknown option $1" >&2; usage >&2; exit 64 ;;
        *) targets+=("$1"); shift ;;
    esac
done
case "$seconds" in '' | *[!0-9]*) echo "fuzz: --seconds takes a whole number, not '$seconds'" >&2; exit 64 ;; esac

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH=/opt/swift/usr/bin:$PATH
fi

scratch=${PEERLINK_FUZZ_SCRATCH_PATH:-.build-fuzz}
say() { echo "fuzz: $*"; }

say "building peerlink-fuzz with libFuzzer and AddressSanitizer in $scratch"
swift build -c release --product peerlink-fuzz --scratch-path "$scratch" \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DPEERLINK_FUZZING 2>&1 | grep -v "Cannot export local symbol '__asan_extra_spill_area'" \
    || { say "build failed"; exit 1; }
binary=$(swift build -c release --scratch-path "$scratch" --show-bin-path)/peerlink-fuzz
[ -x "$binary" ] || { say "no $binary after the build"; exit 1; }
[ "$build_only" = 1 ] && exit 0
if [ "$list" = 1 ]; then "$binary" --list; exit 0; fi
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <("$binary" --list | awk '{ print $1 }')
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
# A Swift trap is reported by AddressSanitizer and libFuzzer; Swift's own backtracer, reading
# memory under ASan, would only add noise.
export SWIFT_BACKTRACE=enable=no
corpora=$scratch/fuzz-corpus
artifacts=$scratch/fuzz-artifacts
mkdir -p "$corpora" "$artifacts"

total=0
failed=()
for target in "${targets[@]}"; do
    seeds=Tests/Fuzz/corpus/$target
    work=$corpora/$target
    mkdir -p "$work"
    [ -d "$seeds" ] || { say "$target: no seed corpus in $seeds"; failed+=("$target"); continue; }
    log=$scratch/fuzz-$target.log
    rc=0
    "$binary" "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/$target-" "$work" "$seeds" >"$log" 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    runs=${runs:-0}
    total=$((total + runs))
    if [ "$rc" != 0 ]; then
        say "$target: FAILED (exit $rc) after $runs executions; log: $log"
        grep -E "ERROR|Fatal error|fuzz check failed|SUMMARY|Test unit written" "$log" | head -n 8 | sed 's/^/    /'
        failed+=("$target")
    else
        printf 'fuzz: %-18s %10d executions, corpus %d inputs\n' "$target" "$runs" "$(find "$work" -type f | wc -l)"
    fi
done

say "$total executions in all, ${#targets[@]} targets, $seconds s each, $(date -u +%Y-%m-%d)"
if [ ${#failed[@]} -gt 0 ]; then
    say "failed: ${failed[*]}"
    exit 1
fi
say "no crash"
