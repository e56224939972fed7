#!/usr/bin/env bash
# test.sh — the one command that sets up and runs the whole PeerLink test suite.
#
# usage: Hardware/test.sh [swift test arguments...]     e.g. Hardware/test.sh --filter LAN
#
# Steps: 1. Hardware/setup.sh --tests (installs what is missing, finds the interop Python)
#        2. Hardware/daemons.sh start (system dbus + lo-only avahi); on exit, `daemons.sh stop`
#           stops only what this run started (and restarts an avahi a test left stopped)
#        3. swift build --build-tests, then swift test --skip-build [arguments...] (without
#           arguments: PeerLinkCore's unit tests first in a process of their own, then every
#           other suite but the avahi-daemon restarts, the 1 GiB transfers, the 8-host soak,
#           the attacks on a chat and the liveness deadlines, which run alone after), then a
#           few-second smoke run
#           of the benchmark (peerlink-bench --smoke --json, its JSON checked by
#           Hardware/bench-check.py; loopback only), the fuzz targets' committed corpus replayed
#           and each target run for a few seconds (Hardware/fuzz.sh --seconds 3: libFuzzer and
#           AddressSanitizer, its own build); at the end, a list of what failed in swift test
#        4. the Bluetooth VM lab: Hardware/bluetooth-lab.sh --skip-build runs the Bluetooth suites
#           in a QEMU VM with two virtual controllers (only when no arguments were given; it
#           cannot run on a machine that is not x86-64: skipped there, a failure with CI=true)
# Exit status: that of swift test (or of the Bluetooth lab if the tests passed).
#
# Exported for the tests:
#   PEERLINK_PYTHON          python3 with the `zeroconf` and `noiseprotocol` packages
#   PEERLINK_DAEMONS_SCRIPT  absolute path of Hardware/daemons.sh (restart-avahi, stop-avahi, ...)
#   PEERLINK_DAEMONS_STATE   its state dir (pids, avahi.conf, avahi.log)
#   PEERLINK_NETLAB_SCRIPT   absolute path of Hardware/netlab.sh (multi-host lab; needs root)
# Environment:
#   PEERLINK_TEST_DRY_RUN=1  do steps 1 and 2 but skip the swift commands and the lab
#   PEERLINK_SKIP_BTVM=1     skip the Bluetooth VM lab (and the install of its packages)
#   PEERLINK_SKIP_FUZZ=1     skip the fuzz replay and run; PEERLINK_FUZZ_SECONDS=N: N s a target
#   PEERLINK_SCRATCH_PATH    build directory (swift --scratch-path; default .build)
#   CI=true                  print a short header of what runs
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

say() { echo "peerlink test: $*"; }

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH=/opt/swift/usr/bin:$PATH
fi

# ---------------------------------------------------------------------------------------------
# The Bluetooth VM lab (Hardware/bluetooth-lab.sh: QEMU guest with two btvirt controllers and
# bluetoothd) runs the Bluetooth suites, which `swift test` on this host skips (no Bluetooth in
# its kernel). It runs after the full suite, not after a filtered one (arguments given).
run_bluetooth_lab() {
    if [ "${PEERLINK_SKIP_BTVM:-0}" = 1 ]; then
        echo "bluetooth lab: skipped (PEERLINK_SKIP_BTVM=1)"
        return 0
    fi
    if [ "$#" -gt 0 ]; then
        echo "bluetooth lab: skipped (test arguments given; run Hardware/bluetooth-lab.sh for it)"
        return 0
    fi
    if [ "${PEERLINK_TEST_DRY_RUN:-0}" = 1 ]; then
        say "dry run: skipping: bash Hardware/bluetooth-lab.sh --skip-build"
        return 0
    fi
    local rc=0
    bash "$HERE/bluetooth-lab.sh" --skip-build || rc=$?
    if [ "$rc" = 77 ]; then
        # the lab cannot run on this machine (not x86-64, packages missing): fatal only in CI
        [ "${CI:-}" = true ] && return 77
        return 0
    fi
    return "$rc"
}

# ---------------------------------------------------------------------------------------------
# 1. dependencies

setup_log=$(mktemp "${TMPDIR:-/tmp}/peerlink-test-setup.XXXXXX")
trap 'rm -f "$setup_log"' EXIT
bash "$HERE/setup.sh" --tests | tee "$setup_log"
PEERLINK_PYTHON=$(sed -n 's/^PEERLINK_PYTHON=//p' "$setup_log" | tail -n 1)
rm -f "$setup_log"
[ -n "$PEERLINK_PYTHON" ] || { say "setup.sh did not report PEERLINK_PYTHON"; exit 1; }
export PEERLINK_PYTHON

# ---------------------------------------------------------------------------------------------
# 2. daemons

export PEERLINK_DAEMONS_SCRIPT=$HERE/daemons.sh
export PEERLINK_NETLAB_SCRIPT=$HERE/netlab.sh
export PEERLINK_DAEMONS_STATE=${PEERLINK_DAEMONS_STATE:-${XDG_RUNTIME_DIR:-/tmp}/peerlink-daemons}

started=none
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    if [ "$started" != none ]; then
        # shellcheck disable=SC2086 # list of daemon names
        bash "$PEERLINK_DAEMONS_SCRIPT" stop $started || true
    fi
    case " $started " in
        *" avahi "*) ;;
        *)  # the avahi we found running was ours from an earlier `daemons.sh start` and a test
            # stopped it (stop-avahi): start it again, as it was before this run
            if ! avahi-daemon --check 2>/dev/null && [ -e "$PEERLINK_DAEMONS_STATE/avahi.conf" ]; then
                say "restarting the avahi-daemon a test left stopped"
                bash "$PEERLINK_DAEMONS_SCRIPT" start-avahi >/dev/null || true
            fi
            ;;
    esac
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

daemons_out=$(bash "$PEERLINK_DAEMONS_SCRIPT" start) || { echo "$daemons_out"; exit 1; }
echo "$daemons_out" | grep -v '^started: '
started=$(echo "$daemons_out" | sed -n 's/^started: //p' | tail -n 1)
started=${started:-none}

# ---------------------------------------------------------------------------------------------
# 3. build and test

scratch=()
if [ -n "${PEERLINK_SCRATCH_PATH:-}" ]; then
    scratch=(--scratch-path "$PEERLINK_SCRATCH_PATH")
fi
build_cmd=(swift build --build-tests "${scratch[@]}")
test_cmd=(swift test --skip-build "${scratch[@]}" "$@")
# The tests that restart avahi-daemon (DaemonRestartTests) run on their own after the rest: the
# other suites' chats and scans would meet the daemon while it is down. So do the 1 GiB transfers
# (LargeFileTests), the 8-host soak (SoakTests) and the attacks on a chat (HostileChatTests:
# 3000 connections, 80 MiB of messages in a debug build): beside the other suites, their load makes
# timed expectations elsewhere late.
# The liveness deadlines (LivenessTimingTests: a vanished peer lost within the policy's 3 s) are
# checked on their own too: as the integration process starts, two hundred tests begin at once
# on its cooperative threads, and a browser's ticks and probes waited their turn long enough to
# see a peer lost 3.1-3.5 s after its port closed (alone: 1.2 s).
#
# Before them, in a process of its own, the unit tests of PeerLinkCore (state machines, codecs,
# seeded simulations: about 45 s of computation in a debug build). Run beside the integration
# suites they held the process's cooperative threads (as many as CPUs) for 20-30 s at a time,
# and the integration suites' timers, probes and link tasks waited for a thread: a liveness test
# saw its peer lost 3.5 s after the cut where 1.8 s is the design's worst case. In their own
# process they only share the CPUs, which the kernel divides fairly.
alone=()
alone_suites=(DaemonRestartTests LargeFileTests SoakTests HostileChatTests LivenessTimingTests)
units=()
if [ $# = 0 ]; then
    units=(swift test --skip-build "${scratch[@]}" --filter PeerLinkCoreTests)
    test_cmd+=(--skip PeerLinkCoreTests)
    for suite in "${alone_suites[@]}"; do test_cmd+=(--skip "$suite"); done
    alone=(swift test --skip-build "${scratch[@]}" --filter)
fi

if [ "${CI:-}" = true ]; then
    echo "================ PeerLink test suite ================"
    echo "commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    # shellcheck disable=SC1091
    echo "host:     $(uname -srm), $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}"), uid $(id -u)"
    echo "swift:    $(swift --version 2>/dev/null | head -n 1 || echo 'not found')"
    echo "python:   $PEERLINK_PYTHON"
    bash "$PEERLINK_DAEMONS_SCRIPT" status | sed 's/^/daemons:  /' || true
    echo "build:    ${build_cmd[*]}"
    [ ${#units[@]} -gt 0 ] && echo "units:    ${units[*]}"
    echo "test:     ${test_cmd[*]}"
    [ ${#alone[@]} -gt 0 ] && for suite in "${alone_suites[@]}"; do echo "then:     ${alone[*]} $suite"; done
    echo "====================================================="
fi

# Each swift test run's output is kept (tee) so that the end of the run can list what failed:
# a CI log that shows only its tail still names every failing test.
test_log=$(mktemp "${TMPDIR:-/tmp}/peerlink-test-log.XXXXXX")
logged() {
    local rc
    set +e
    "$@" 2>&1 | tee -a "$test_log"
    rc=${PIPESTATUS[0]}
    set -e
    return "$rc"
}
failures_summary() {
    local lines
    lines=$(grep -aE '^✘ |: error: |^Test Case .* failed|Fatal error|Crash|[Ss]ignal [0-9]+|exited with unexpected signal' "$test_log" | head -n 80 || true)
    if [ -n "$lines" ]; then
        echo "================ what failed in swift test (full output: $test_log) ================"
        echo "$lines"
    else
        rm -f "$test_log"
    fi
}

test_rc=0
if [ "${PEERLINK_TEST_DRY_RUN:-0}" = 1 ]; then
    say "dry run: skipping: ${build_cmd[*]}"
    [ ${#units[@]} -gt 0 ] && say "dry run: skipping: ${units[*]}"
    say "dry run: skipping: ${test_cmd[*]}"
else
    "${build_cmd[@]}" || { test_rc=$?; say "build failed (exit $test_rc)"; exit "$test_rc"; }
    if [ ${#units[@]} -gt 0 ]; then
        logged "${units[@]}" || test_rc=$?
    fi
    logged "${test_cmd[@]}" || { suites_rc=$?; [ "$test_rc" = 0 ] && test_rc=$suites_rc; }
    if [ ${#alone[@]} -gt 0 ]; then
        for suite in "${alone_suites[@]}"; do
            logged "${alone[@]}" "$suite" || { alone_rc=$?; [ "$test_rc" = 0 ] && test_rc=$alone_rc; }
        done
    fi
    # The benchmark's smoke run: it must run to the end and print every measurement --json
    # promises (bench-check.py); its figures mean nothing in a debug build.
    if [ "$test_rc" = 0 ] && [ $# = 0 ]; then
        bench=$(swift build "${scratch[@]}" --show-bin-path)/peerlink-bench
        say "benchmark smoke run: $bench --smoke --json"
        bench_json=$(mktemp "${TMPDIR:-/tmp}/peerlink-bench.XXXXXX")
        if timeout 300 "$bench" --smoke --json >"$bench_json"; then
            python3 "$HERE/bench-check.py" tcp <"$bench_json" || { test_rc=1; cat "$bench_json"; say "benchmark smoke run: its JSON is not as documented"; }
        else
            test_rc=$?
            say "benchmark smoke run failed (exit $test_rc)"
        fi
        rm -f "$bench_json"
    fi
    # The decoders' fuzz targets: the committed corpus replayed (every input that once crashed
    # one stays there), then each target for a few seconds under libFuzzer and AddressSanitizer.
    if [ "$test_rc" = 0 ] && [ $# = 0 ] && [ "${PEERLINK_SKIP_FUZZ:-0}" != 1 ]; then
        fuzz=$(swift build "${scratch[@]}" --show-bin-path)/peerlink-fuzz
        say "fuzz corpus replay: $fuzz TARGET Tests/Fuzz/corpus/TARGET"
        for target in $("$fuzz" --list | awk '{ print $1 }'); do
            "$fuzz" "$target" "Tests/Fuzz/corpus/$target" >/dev/null || { test_rc=1; say "fuzz corpus replay failed: $target"; }
        done
        say "fuzz run: Hardware/fuzz.sh --seconds ${PEERLINK_FUZZ_SECONDS:-3}"
        timeout 1200 bash "$HERE/fuzz.sh" --seconds "${PEERLINK_FUZZ_SECONDS:-3}" || { test_rc=$?; say "fuzz run failed (exit $test_rc)"; }
    fi
fi

# ---------------------------------------------------------------------------------------------
# 4. Bluetooth

bt_rc=0
run_bluetooth_lab "$@" || bt_rc=$?

failures_summary
if [ "${CI:-}" = true ]; then
    echo "================ swift test exit $test_rc, bluetooth lab exit $bt_rc ================"
fi
if [ "$test_rc" != 0 ]; then exit "$test_rc"; fi
exit "$bt_rc"
