#!/usr/bin/env bash
# bluetooth-bench.sh — builds the benchmark and runs `peerlink-bench --bluetooth` inside the Bluetooth VM lab.
#
# usage: Hardware/bluetooth-bench.sh [--skip-build] [--debug] [--smoke] [--console] [-- BENCH ARGS...]
#
# The lab is the throw-away QEMU VM of Hardware/bluetooth-lab.sh (Hardware/btvm, see its README):
# this machine's Debian kernel with two virtual BR/EDR controllers that reach each other, hci0
# 00:AA:01:00:00:00 and hci1 00:AA:01:01:00:01. The guest sees this machine's files read-only at
# the same paths and runs the benchmark built here:
#
#   .build/release/peerlink-bench --bluetooth --listen-on hci0 --dial-from hci1
#
# It prints one table per link kind (RFCOMM, L2CAP): connect time, throughput of encrypted
# 1 KiB and 64 KiB messages and of one stream, and 64 B round trips, each next to a raw socket of
# the same kind between the same two adapters (see the Performance article). The controllers are
# emulated in software (btvirt), so read the ratios rather than the rates.
#
#   --skip-build  do not run `swift build` first (use the binary as it is)
#   --debug       use the debug build (quicker to build; its figures mean little)
#   --smoke       a short run (small volumes, few samples) that checks every measurement runs
#   --console     print the guest's serial console afterwards (for VM trouble)
#   -- ARGS...    more arguments for peerlink-bench (such as --volume 8388608)
#
# Environment: PEERLINK_SCRATCH_PATH (build directory, default .build), PEERLINK_LAB_TIMEOUT (hard
# limit for the VM in seconds, default 900), BTVM_ACCEL=auto|tcg|kvm (see Hardware/btvm/README.md).
# Exit status: that of the benchmark in the VM; 124 the VM timed out; 125 the VM could not start;
# 77 the lab cannot run on this machine (not x86-64, or its packages are missing: run
# `Hardware/setup.sh --tests`); 2 bad arguments.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

say() { echo "bluetooth bench: $*"; }

BUILD=1
CONFIG=release
CONSOLE=()
BENCH_ARGS=(--bluetooth --listen-on hci0 --dial-from hci1)
while [ $# -gt 0 ]; do
    case "$1" in
        --skip-build) BUILD=0; shift ;;
        --debug) CONFIG=debug; shift ;;
        --smoke) BENCH_ARGS+=(--smoke); shift ;;
        --console) CONSOLE=(--console); shift ;;
        --) shift; BENCH_ARGS+=("$@"); break ;;
        -h | --help) usage; exit 0 ;;
        *) say "unknown argument: $1 (see --help)"; usage >&2; exit 2 ;;
    esac
done

. "$HERE/lab-common.sh"
lab_require qemu-system-x86_64 btvirt cpio

if [ "$BUILD" = 1 ]; then
    say "building the benchmark (swift build -c $CONFIG --product peerlink-bench ${scratch[*]})"
    swift build -c "$CONFIG" --product peerlink-bench "${scratch[@]}"
fi
BIN=$(cd "$SCRATCH" && pwd)/$CONFIG/peerlink-bench
[ -x "$BIN" ] || { say "no benchmark at $BIN: build it with swift build -c $CONFIG --product peerlink-bench (or drop --skip-build)"; exit 2; }

# The command run in the guest (by sh -c, in this directory); arguments quoted for that shell.
guest_cmd="exec $(printf %q "$BIN")"
for arg in "${BENCH_ARGS[@]}"; do guest_cmd+=" $(printf %q "$arg")"; done

say "running peerlink-bench ${BENCH_ARGS[*]} in the VM"
# the links need only the kernel: no bluetoothd
lab_boot "$guest_cmd" "${CONSOLE[@]}"
case "$LAB_RC" in
    0) say "done" ;;
    124) say "the VM ran out of time (${PEERLINK_LAB_TIMEOUT:-900} s): rerun with --console, or with --smoke" ;;
    125) ;;
    *) say "the benchmark failed (exit $LAB_RC)" ;;
esac
exit "$LAB_RC"
