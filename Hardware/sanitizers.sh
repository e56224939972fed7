#!/usr/bin/env bash
# sanitizers.sh — the unit and session suites under AddressSanitizer (and ThreadSanitizer).
#
# usage: Hardware/sanitizers.sh [--address] [--thread] [--filter REGEX]
#
#   --address      AddressSanitizer (with LeakSanitizer): the default
#   --thread       ThreadSanitizer (PeerLink's locks are `Locked`, pthread mutexes it sees;
#                  Swift's Synchronization.Mutex, a bare futex on Linux, would be reported as
#                  races)
#   --filter R     the tests to run (default: the PeerLinkCoreTests, PeerLinkSessionTests and
#                  PeerLinkFilesTests targets — the suites that need no daemon, no root and no
#                  other process)
#
# The tests run one at a time (--no-parallel): a sanitizer slows code 5-15 times, and beside
# each other the suites' timed expectations (keep-alives, handshakes) fail for that alone.
# Each sanitizer has its own build directory (.build-tsan, .build-asan; or
# PEERLINK_SANITIZER_SCRATCH_PREFIX-thread / -address), built with `swift build --build-tests
# --sanitize=…` and run with `swift test --skip-build --sanitize=…`. A sanitizer report fails the
# run: the script counts "WARNING: ThreadSanitizer" and "ERROR: AddressSanitizer" lines (leaks
# included) in the output, prints them, and exits 1 if there is any, or if a test failed.
# Output goes to BUILD/sanitizer.log. Loopback only: the suites open TCP sockets on 127.0.0.1.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

sanitizers=()
filter='^(PeerLinkCoreTests|PeerLinkSessionTests|PeerLinkFilesTests)\.'
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --thread) sanitizers+=(thread); shift ;;
        --address) sanitizers+=(address); shift ;;
        --filter) filter=${2:?--filter needs a regular expression}; shift 2 ;;
        *) echo "sanitizers: unknown argument $1" >&2; usage >&2; exit 64 ;;
    esac
done
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(address)

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH=/opt/swift/usr/bin:$PATH
fi
say() { echo "sanitizers: $*"; }

# halt_on_error off: every report of a run is counted, not only the first.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:second_deadlock_stack=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=0:detect_stack_use_after_return=0}
# Not leaks of PeerLink's: XCTest's own runner keeps two objects to the end of its (empty) run,
# and what a global's one-time initialiser allocates (a test's static Data, Process) lives as
# long as the process, though LeakSanitizer does not always find the pointer to it.
lsan_suppressions=$(mktemp)
trap 'rm -f "$lsan_suppressions"' EXIT
printf 'leak:libXCTest.so\nleak:once_slow\n' >"$lsan_suppressions"
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$lsan_suppressions:print_suppressions=0}
export SWIFT_BACKTRACE=enable=no

failed=0
for sanitizer in "${sanitizers[@]}"; do
    case "$sanitizer" in
        thread) scratch=${PEERLINK_SANITIZER_SCRATCH_PREFIX:-.build-tsan} ;;
        address) scratch=${PEERLINK_SANITIZER_SCRATCH_PREFIX:-.build-asan} ;;
    esac
    [ -n "${PEERLINK_SANITIZER_SCRATCH_PREFIX:-}" ] && scratch=$scratch-$sanitizer
    log=$scratch/sanitizer.log
    mkdir -p "$scratch"
    start=$(date +%s)
    say "$sanitizer: building in $scratch"
    if ! swift build --build-tests --scratch-path "$scratch" --sanitize="$sanitizer" >"$log" 2>&1; then
        tail -n 30 "$log"
        say "$sanitizer: build failed (log: $log)"
        failed=1
        continue
    fi
    built=$(date +%s)
    say "$sanitizer: running the tests matching $filter"
    rc=0
    swift test --skip-build --scratch-path "$scratch" --sanitize="$sanitizer" --no-parallel --filter "$filter" >>"$log" 2>&1 || rc=$?
    done_at=$(date +%s)
    reports=$(grep -cE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$log" || true)
    summary=$(grep -E "Test run with [0-9]+ tests" "$log" | tail -n 1 || true)
    say "$sanitizer: ${summary:-no test summary}; $reports sanitizer reports; build $((built - start)) s, tests $((done_at - built)) s"
    if [ "$reports" != 0 ]; then
        grep -E -A 12 "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$log" | head -n 80
        failed=1
    fi
    if [ "$rc" != 0 ]; then
        grep -E "✘" "$log" | head -n 20 || true
        say "$sanitizer: swift test exited $rc (log: $log)"
        failed=1
    fi
done
exit "$failed"
