#!/usr/bin/env bash
# daemons.sh — make sure a system dbus-daemon and an avahi-daemon run, for local tests.
#
# usage: Hardware/daemons.sh COMMAND [--state DIR]
#   start          start whatever of dbus / avahi is not running; prints `started: LIST` last
#                  (LIST = the daemons this call started, or `none`)
#   stop [NAME..]  stop what `start` recorded (dbus, avahi, or both when no NAME is given);
#                  daemons this script did not start are never touched
#   status         dbus and avahi state (pid, started by this script or not, avahi host name);
#                  exit 0 if both run, 1 otherwise
#   start-avahi    start avahi only (dbus must already run)
#   stop-avahi     stop the avahi-daemon this script started (same as `stop avahi`)
#   restart-avahi  stop and start the avahi-daemon this script started, with the same config
#                  (integration tests use it to check re-publication after a daemon restart)
# options/env: --state DIR (default $PEERLINK_DAEMONS_STATE, else
#              ${XDG_RUNTIME_DIR:-/tmp}/peerlink-daemons) holds pids, avahi.conf, avahi.log.
# exit codes: 0 ok, 1 error, 2 usage, 3 avahi runs but was not started by this script
#             (stop-avahi / restart-avahi refuse to touch it).
#
# The avahi-daemon started here only ever uses the loopback interface (allow-interfaces=lo in
# its own config; /etc/avahi/avahi-daemon.conf is never used), so multicast DNS cannot leave
# this machine. lo gets the MULTICAST flag if it lacks it (reverted by stop). An avahi-daemon
# or dbus-daemon that is already running is used as it is and left alone.
# Starting daemons needs root; status does not.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
say() { echo "peerlink daemons: $*"; }
die() { echo "peerlink daemons: error: $*" >&2; exit 1; }

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
DBUS_SOCKET=/run/dbus/system_bus_socket
DBUS_PIDFILE=/run/dbus/pid
AVAHI_PIDFILE=/run/avahi-daemon/pid

cmd=""
names=()
STATE=${PEERLINK_DAEMONS_STATE:-${XDG_RUNTIME_DIR:-/tmp}/peerlink-daemons}
while [ $# -gt 0 ]; do
    case "$1" in
        --state) [ $# -ge 2 ] || { usage >&2; exit 2; }; STATE=$2; shift 2 ;;
        --state=*) STATE=${1#--state=}; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "peerlink daemons: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) if [ -z "$cmd" ]; then cmd=$1; else names+=("$1"); fi; shift ;;
    esac
done
case "$STATE" in /*) ;; *) STATE=$PWD/$STATE ;; esac

# ---------------------------------------------------------------------------------------------
# helpers

is_root() { [ "$(id -u)" = 0 ]; }

# true if PID is a live (non-zombie) process whose command name is NAME
alive_as() {
    local pid=$1 name=$2
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

gone() { ! [ -d "/proc/$1" ] || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

read_pid() { if [ -r "$1" ]; then tr -dc '0-9' <"$1"; fi; }

# pid recorded in the state dir for dbus|avahi, printed only if that process still runs
our_pid() {
    local comm pid
    case "$1" in dbus) comm=dbus-daemon ;; avahi) comm=avahi-daemon ;; *) return 1 ;; esac
    pid=$(read_pid "$STATE/$1.pid")
    alive_as "$pid" "$comm" || return 1
    echo "$pid"
}

dbus_answers() {
    [ -S "$DBUS_SOCKET" ] || return 1
    timeout 5 dbus-send --system --dest=org.freedesktop.DBus --type=method_call --print-reply \
        /org/freedesktop/DBus org.freedesktop.DBus.GetId >/dev/null 2>&1
}

avahi_running() { avahi-daemon --check >/dev/null 2>&1; }

need_root() {
    is_root && return 0
    echo "peerlink daemons: error: $1 needs root; run: sudo $SELF $cmd --state $STATE" >&2
    exit 1
}

lock_state() {
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    flock -w 60 9 || die "could not lock $STATE/lock within 60 s"
}

lo_has_multicast() { ip link show dev lo | head -n 1 | grep -q '[<,]MULTICAST[,>]'; }

avahi_host_name() {
    local pid=$1 name=""
    if [ "$(our_pid avahi || true)" = "$pid" ] && [ -r "$STATE/avahi.log" ]; then
        name=$(sed -n 's/.*Server startup complete\. Host name is \([^ ]*\)\. .*/\1/p' "$STATE/avahi.log" | tail -n 1)
    fi
    if [ -z "$name" ] && [ -r "/proc/$pid/cmdline" ]; then
        # avahi-daemon sets its process title to "avahi-daemon: running [host.local]"
        name=$(tr '\0' ' ' <"/proc/$pid/cmdline" | sed -n 's/.*running \[\([^]]*\)\].*/\1/p')
    fi
    echo "${name:-?}"
}

write_avahi_conf() {
    cat >"$STATE/avahi.conf" <<'EOF'
# written by Hardware/daemons.sh: loopback only, so multicast DNS never leaves this machine
[server]
use-ipv4=yes
use-ipv6=no
allow-interfaces=lo
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
[reflector]
[rlimits]
EOF
}

# ---------------------------------------------------------------------------------------------
# dbus

STARTED=()

start_dbus() {
    local pid
    if dbus_answers; then
        pid=$(read_pid "$DBUS_PIDFILE")
        if [ -n "$pid" ] && [ "$(our_pid dbus || true)" = "$pid" ]; then
            say "dbus: running (pid $pid, started by daemons.sh)"
        else
            say "dbus: running (pid ${pid:-?}, not started by daemons.sh; leaving it alone)"
        fi
        return 0
    fi
    command -v dbus-daemon >/dev/null 2>&1 || die "dbus-daemon not installed (run Hardware/setup.sh)"
    need_root "starting the system dbus-daemon"
    pid=$(read_pid "$DBUS_PIDFILE")
    if [ -n "$pid" ] && alive_as "$pid" dbus-daemon; then
        die "dbus-daemon pid $pid runs but does not answer on $DBUS_SOCKET"
    fi
    rm -f "$DBUS_PIDFILE"    # stale: dbus-daemon refuses to start while it exists
    mkdir -p /run/dbus
    # (9>&-: the daemon must not inherit the state lock)
    pid=$(dbus-daemon --system --fork --print-pid 9>&- | head -n 1 | tr -dc '0-9')
    [ -n "$pid" ] || die "dbus-daemon --system did not start"
    echo "$pid" >"$STATE/dbus.pid"
    for _ in $(seq 1 50); do
        dbus_answers && break
        sleep 0.1
    done
    dbus_answers || die "dbus-daemon (pid $pid) started but does not answer on $DBUS_SOCKET"
    say "dbus: started (pid $pid)"
    STARTED+=(dbus)
}

# ---------------------------------------------------------------------------------------------
# avahi

start_avahi() {
    local pid ok=0
    if avahi_running; then
        pid=$(read_pid "$AVAHI_PIDFILE")
        if [ "$(our_pid avahi || true)" = "$pid" ]; then
            say "avahi: running (pid $pid, host name $(avahi_host_name "$pid"), started by daemons.sh, lo only)"
        else
            say "avahi: running (pid ${pid:-?}, host name $(avahi_host_name "$pid"), not started by daemons.sh; leaving it alone)"
        fi
        return 0
    fi
    command -v avahi-daemon >/dev/null 2>&1 || die "avahi-daemon not installed (run Hardware/setup.sh)"
    dbus_answers || die "the system dbus does not answer (run: $SELF start)"
    need_root "starting avahi-daemon"
    rm -f "$STATE/avahi.pid"
    write_avahi_conf
    if ! lo_has_multicast; then
        ip link set dev lo multicast on
        touch "$STATE/lo-multicast"
    fi
    mkdir -p /run/avahi-daemon
    [ -f "$STATE/avahi.log" ] && mv -f "$STATE/avahi.log" "$STATE/avahi.log.1"
    # in the background rather than -D, so that the debug log goes to a file (no syslog here);
    # setsid: not killed along with the caller's process group (e.g. Ctrl-C of a test run)
    # (9>&-: the daemon must not inherit the state lock)
    setsid avahi-daemon -f "$STATE/avahi.conf" --no-drop-root --debug \
        </dev/null >"$STATE/avahi.log" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$STATE/avahi.pid"
    for _ in $(seq 1 100); do
        if grep -q "Server startup complete" "$STATE/avahi.log" 2>/dev/null; then ok=1; break; fi
        gone "$pid" && break
        sleep 0.1
    done
    # normally $! is avahi-daemon itself (setsid only forks when run as a process group leader)
    if [ "$ok" = 1 ] && ! alive_as "$pid" avahi-daemon; then
        pid=$(read_pid "$AVAHI_PIDFILE")
        echo "$pid" >"$STATE/avahi.pid"
    fi
    if [ "$ok" != 1 ] || ! alive_as "$pid" avahi-daemon; then
        tail -n 20 "$STATE/avahi.log" >&2 || true
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$STATE/avahi.pid"
        revert_lo
        die "avahi-daemon did not report startup within 10 s (log: $STATE/avahi.log)"
    fi
    say "avahi: started (pid $pid, host name $(avahi_host_name "$pid"), lo only, log $STATE/avahi.log)"
    STARTED+=(avahi)
}

revert_lo() {
    if [ -f "$STATE/lo-multicast" ]; then
        if avahi_running; then
            say "lo: leaving the MULTICAST flag on (another avahi-daemon runs)"
        else
            ip link set dev lo multicast off 2>/dev/null || true
        fi
        rm -f "$STATE/lo-multicast"
    fi
}

# ---------------------------------------------------------------------------------------------
# stop

# stop dbus|avahi if this script started it: SIGTERM, up to 5 s, then SIGKILL
stop_one() {
    local name=$1 pid
    if ! pid=$(our_pid "$name"); then
        say "$name: nothing to stop (not started by daemons.sh, or already gone)"
        rm -f "$STATE/$name.pid"
        [ "$name" = avahi ] && revert_lo
        return 0
    fi
    is_root || [ -O "/proc/$pid" ] || need_root "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        gone "$pid" && break
        sleep 0.1
    done
    if ! gone "$pid"; then
        say "$name: pid $pid still there after 5 s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 1 20); do
            gone "$pid" && break
            sleep 0.1
        done
        gone "$pid" || die "$name (pid $pid) did not exit"
    fi
    rm -f "$STATE/$name.pid"
    if [ "$name" = avahi ]; then
        revert_lo
    fi
    say "$name: stopped (pid $pid)"
}

# ---------------------------------------------------------------------------------------------
# status

status() {
    local pid rc=0 who
    pid=$(read_pid "$DBUS_PIDFILE")
    if dbus_answers; then
        who="not started by daemons.sh"
        [ -n "$pid" ] && [ "$(our_pid dbus || true)" = "$pid" ] && who="started by daemons.sh"
        echo "dbus:  running, pid ${pid:-?}, $who"
    else
        echo "dbus:  not running (no answer on $DBUS_SOCKET)"
        rc=1
    fi
    if avahi_running; then
        pid=$(read_pid "$AVAHI_PIDFILE")
        if [ "$(our_pid avahi || true)" = "$pid" ]; then
            who="started by daemons.sh, config $STATE/avahi.conf (lo only), log $STATE/avahi.log"
        else
            who="not started by daemons.sh"
        fi
        echo "avahi: running, pid ${pid:-?}, host name $(avahi_host_name "$pid"), $who"
    else
        echo "avahi: not running"
        rc=1
    fi
    if [ -f "$STATE/lo-multicast" ]; then
        echo "lo:    MULTICAST flag set by daemons.sh (stop reverts it)"
    fi
    echo "state: $STATE"
    return $rc
}

# ---------------------------------------------------------------------------------------------

print_started() {
    if [ ${#STARTED[@]} -eq 0 ]; then echo "started: none"; else echo "started: ${STARTED[*]}"; fi
}

require_ours_or_none() {
    # exit 3 if an avahi-daemon runs that this script did not start
    if avahi_running && ! our_pid avahi >/dev/null; then
        echo "peerlink daemons: avahi-daemon pid $(read_pid "$AVAHI_PIDFILE") was not started by daemons.sh (state $STATE); not touching it" >&2
        exit 3
    fi
}

case "$cmd" in
    start)
        lock_state
        start_dbus
        start_avahi
        print_started
        ;;
    start-avahi)
        lock_state
        start_avahi
        print_started
        ;;
    stop)
        lock_state
        [ ${#names[@]} -gt 0 ] || names=(avahi dbus)
        for n in "${names[@]}"; do
            case "$n" in dbus | avahi) ;; none) continue ;; *) die "unknown daemon $n (dbus|avahi)" ;; esac
        done
        # avahi first: it is a client of dbus
        for n in avahi dbus; do
            for m in "${names[@]}"; do
                if [ "$m" = "$n" ]; then stop_one "$n"; break; fi
            done
        done
        ;;
    stop-avahi)
        lock_state
        require_ours_or_none
        stop_one avahi
        ;;
    restart-avahi)
        lock_state
        require_ours_or_none
        stop_one avahi
        start_avahi
        ;;
    status)
        status
        ;;
    *)
        usage >&2
        exit 2
        ;;
esac
