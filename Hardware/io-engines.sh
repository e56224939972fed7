#!/usr/bin/env bash
# io-engines.sh — PeerLink's I/O reactor against SwiftNIO's and blocking sockets, loopback TCP.
#
# usage: Hardware/io-engines.sh [--skip-build] [-- ARGS...]
#
# Builds Hardware/io-engines (a package of its own, so that PeerLink itself does not depend on
# SwiftNIO) in release and runs it: the same bulk transfer, 64-byte writes and 64-byte round
# trips over one loopback TCP connection, done by
#
#   raw          blocking sockets, a thread per side (the baseline)
#   peerlink     PeerLink's TCPConnection: non-blocking calls tried at once, parked on the
#                I/O thread (Readiness, epoll) when they would block; tasks on the cooperative pool
#   nio-async    SwiftNIO's NIOAsyncChannel (channels on event loops, tasks awaiting them)
#   nio-handler  SwiftNIO channel handlers on the event loops (no task in between)
#
# each figure with its ratio to raw and the processor time used. The Architecture article gives
# the figures that decided PeerLink's I/O engine. Nothing leaves 127.0.0.1.
#
#   --skip-build  run the binary as it is
#   -- ARGS...    for the tool: --volume BYTES, --messages N, --samples N, --runs N, --smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGE="$HERE/io-engines"
BUILD=1
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --skip-build) BUILD=0; shift ;;
        --) shift; ARGS+=("$@"); break ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "io-engines: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$BUILD" = 1 ]; then
    swift build -c release --package-path "$PACKAGE"
fi
exec timeout 900 "$(swift build -c release --package-path "$PACKAGE" --show-bin-path)/io-engines" "${ARGS[@]}"
