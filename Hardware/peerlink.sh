#!/usr/bin/env bash
# peerlink.sh — quick start: install what is missing, make sure dbus + avahi run, build, run peerlink.
#
# usage: Hardware/peerlink.sh [peerlink arguments...]
#        (no arguments: chat --name "$(hostname)")
#
# 1. Hardware/setup.sh (build/run dependencies; Swift 6.2+ must be installed)
# 2. dbus + avahi-daemon: if avahi-daemon does not run, `systemctl start avahi-daemon` on a
#    systemd machine (via sudo when not root); without systemd (e.g. in a container) it falls back
#    to Hardware/daemons.sh start, a loopback-only avahi-daemon: discovery then only finds peers
#    on this machine (stop it later with Hardware/daemons.sh stop)
# 3. swift build -c release --product peerlink (quiet), then exec the binary with the arguments
# env: PEERLINK_SCRATCH_PATH  build directory (swift --scratch-path; default .build)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

say() { echo "peerlink: $*" >&2; }
die() { echo "peerlink: error: $*" >&2; exit 1; }

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH=/opt/swift/usr/bin:$PATH
fi

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        return 1
    fi
}

# 1. dependencies (its messages go to stderr: stdout belongs to peerlink)
bash "$HERE/setup.sh" >&2

# 2. daemons
dbus_answers() {
    timeout 5 dbus-send --system --dest=org.freedesktop.DBus --type=method_call --print-reply \
        /org/freedesktop/DBus org.freedesktop.DBus.GetId >/dev/null 2>&1
}
avahi_running() { avahi-daemon --check >/dev/null 2>&1; }
have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

if ! avahi_running || ! dbus_answers; then
    if have_systemd; then
        say "starting avahi-daemon: systemctl start avahi-daemon"
        as_root systemctl start dbus avahi-daemon \
            || die "could not start avahi-daemon; run: sudo systemctl enable --now avahi-daemon"
        for _ in $(seq 1 50); do
            avahi_running && dbus_answers && break
            sleep 0.1
        done
        avahi_running || die "avahi-daemon is not running; see: systemctl status avahi-daemon"
    else
        say "no systemd here: starting dbus and a loopback-only avahi-daemon (Hardware/daemons.sh)"
        bash "$HERE/daemons.sh" start >&2
    fi
fi
if bash "$HERE/daemons.sh" status 2>/dev/null | grep -q '^avahi: .*, started by daemons.sh'; then
    say "avahi-daemon runs on the loopback interface only: discovery is limited to this machine"
    say "(stop it with: Hardware/daemons.sh stop)"
fi

# 3. build and run
scratch=()
if [ -n "${PEERLINK_SCRATCH_PATH:-}" ]; then
    scratch=(--scratch-path "$PEERLINK_SCRATCH_PATH")
fi
say "building (swift build -c release --product peerlink)"
build_log=$(mktemp "${TMPDIR:-/tmp}/peerlink-build.XXXXXX")
if ! swift build -c release --product peerlink --quiet "${scratch[@]}" >"$build_log" 2>&1; then
    cat "$build_log" >&2
    rm -f "$build_log"
    die "build failed"
fi
rm -f "$build_log"
bin=$(swift build -c release --show-bin-path "${scratch[@]}")/peerlink
[ -x "$bin" ] || die "no binary at $bin"

if [ $# -eq 0 ]; then
    set -- chat --name "$(hostname)"
fi
exec "$bin" "$@"
