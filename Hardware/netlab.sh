#!/usr/bin/env bash
# netlab.sh — N simulated hosts on one machine, each with its own dbus-daemon + avahi-daemon.
#
# usage: Hardware/netlab.sh up N             create hosts 1..N (1..100) and start dbus+avahi in each
#        Hardware/netlab.sh down             stop everything in the lab, remove namespaces and mounts
#        Hardware/netlab.sh exec I CMD...    run CMD on host I (its network + mount namespace)
#        Hardware/netlab.sh addr I           print host I's IPv4 address
#        Hardware/netlab.sh cut I [--silent] pull host I's cable: its port on the hub goes down, so
#                                            nothing reaches it any more (host I sees no carrier);
#                                            --silent: the hub drops its frames, carrier stays up
#        Hardware/netlab.sh heal I           plug host I back in
#        Hardware/netlab.sh status           hosts, addresses, links, daemons
#        Hardware/netlab.sh selftest         up 2; mDNS publish/browse/resolve across hosts; ping;
#                                            cut/heal; down; check that nothing is left behind
# env:   LAB_PREFIX (default plk; [a-z][a-z0-9]{0,7}) names the namespaces: PREFIX-hub, PREFIX-h1..
#        LAB_DIR (default /tmp/peerlink-netlab-PREFIX) holds configs, logs, pids
#        LAB_IPV6=1 lets avahi use IPv6 too (default IPv4 only: one browse result per service)
#        Labs with different LAB_PREFIX values (and LAB_DIRs) can run side by side.
#
# Host I = network namespace PREFIX-hI + a persistent mount namespace in which /run/dbus and
# /run/avahi-daemon are private tmpfs mounts, so the stock paths (/run/dbus/system_bus_socket,
# /run/avahi-daemon/socket) belong to that host's daemons and any libavahi-client program run
# with `exec` talks to that host's avahi without environment tweaks. Hosts are joined by veth
# pairs ("eth0" in the host, "vI" on the hub) to a bridge in the hub namespace; nothing is created
# in, or routed to, the root namespace. Address of host I: 10.99.0.(10+I)/24 on its eth0. Each
# avahi-daemon uses allow-interfaces=eth0: the namespace's own interface. Needs root.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "netlab: $*" >&2; exit 1; }

P=${LAB_PREFIX:-plk}
[[ "$P" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "LAB_PREFIX must match [a-z][a-z0-9]{0,7} (got '$P')"
LAB_DIR=${LAB_DIR:-/tmp/peerlink-netlab-$P}
HUB=$P-hub
SUBNET_PREFIX=10.99.0
MAX_HOSTS=100

node_ns() { echo "$P-h$1"; }
mnt_file() { echo "$LAB_DIR/h$1/mntns"; }
host_addr() { echo "$SUBNET_PREFIX.$((10 + $1))"; }
ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
lab_count() { cat "$LAB_DIR/count" 2>/dev/null || echo 0; }

check_host() {
    [[ "${1:-}" =~ ^[0-9]+$ ]] || die "host index must be a number (got '${1:-}')"
    local n
    n=$(lab_count)
    if [ "$1" -lt 1 ] || [ "$1" -gt "$n" ]; then die "no host $1 (lab '$P' has $n hosts; LAB_DIR=$LAB_DIR)"; fi
}

# Run a command inside host I: its netns plus its private mount namespace.
in_host() {
    local i=$1
    shift
    nsenter --net=/run/netns/"$(node_ns "$i")" --mount="$(mnt_file "$i")" --wd="$PWD" -- "$@"
}

# Our own namespaces that exist right now (hosts of this prefix, then the hub).
lab_namespaces() {
    ip netns list | awk '{print $1}' | grep -E "^$P-h[0-9]+\$" || true
    ip netns list | awk '{print $1}' | grep -x "$HUB" || true
}

up() {
    local n=${1:-}
    if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt $MAX_HOSTS ]; then
        die "usage: $0 up N (1..$MAX_HOSTS)"
    fi
    [ "$(id -u)" = 0 ] || die "needs root"
    local tool
    for tool in avahi-daemon dbus-daemon nsenter unshare ip; do
        command -v "$tool" >/dev/null || die "$tool missing (run Hardware/setup.sh)"
    done
    if [ -n "$(lab_namespaces)" ] || [ -e "$LAB_DIR/count" ]; then
        die "lab '$P' already up (run: LAB_PREFIX=$P $0 down)"
    fi
    trap 'echo "netlab: up failed, tearing down" >&2; down' EXIT
    mkdir -p "$LAB_DIR"
    # A persistent mount namespace is pinned by bind-mounting /proc/PID/ns/mnt onto a file; the
    # file must sit on a mount with private propagation, hence this self-bind.
    if ! mountpoint -q "$LAB_DIR"; then
        mount --bind "$LAB_DIR" "$LAB_DIR"
    fi
    mount --make-private "$LAB_DIR"
    echo "$n" >"$LAB_DIR/count"

    ip netns add "$HUB"
    ip -n "$HUB" link set lo up
    ip -n "$HUB" link add br0 type bridge
    ip -n "$HUB" link set br0 type bridge mcast_snooping 0 stp_state 0 forward_delay 0
    ip -n "$HUB" link set br0 up

    local i ns v6
    v6=$([ "${LAB_IPV6:-0}" = 1 ] && echo yes || echo no)
    for i in $(seq 1 "$n"); do
        ns=$(node_ns "$i")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # veth: "eth0" inside the host, "v$i" on the hub bridge
        ip -n "$ns" link add eth0 type veth peer name "v$i" netns "$HUB"
        ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 multicast on up
        ip -n "$HUB" link set "v$i" master br0 multicast on up

        mkdir -p "$LAB_DIR/h$i"
        touch "$(mnt_file "$i")"
        # slave: later mounts in the root namespace still propagate in; ours don't leak out.
        unshare --mount="$(mnt_file "$i")" --propagation slave true
        in_host "$i" sh -c '
            mount -t tmpfs -o mode=0755 tmpfs /run/dbus &&
            mount -t tmpfs -o mode=0755 tmpfs /run/avahi-daemon &&
            chown avahi:avahi /run/avahi-daemon &&
            umount -l /sys && mount -t sysfs sysfs /sys'   # so /sys/class/net shows this netns

        cat >"$LAB_DIR/h$i/avahi-daemon.conf" <<EOF
# written by Hardware/netlab.sh: only the namespace's own eth0
[server]
host-name=host$i
domain-name=local
use-ipv4=yes
use-ipv6=$v6
allow-interfaces=eth0
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
# without this, an IPv4-only daemon still answers with the host's fe80:: AAAA record, and a
# resolver asked for AVAHI_PROTO_UNSPEC addresses (avahi-browse -r) may report fe80::... instead of 10.99.0.x
publish-aaaa-on-ipv4=$v6
[reflector]
[rlimits]
EOF
        in_host "$i" dbus-daemon --system --fork --print-pid >"$LAB_DIR/h$i/dbus.pid"
        # Foreground-with-& rather than -D so the log goes to a file (there is no syslog here);
        # exec so that $! is avahi-daemon itself; setsid so a Ctrl-C of the caller does not reach it.
        (exec setsid nsenter --net=/run/netns/"$ns" --mount="$(mnt_file "$i")" --wd=/ -- \
            avahi-daemon -f "$LAB_DIR/h$i/avahi-daemon.conf" --debug) \
            </dev/null >"$LAB_DIR/h$i/avahi.log" 2>&1 &
        echo $! >"$LAB_DIR/h$i/avahi.pid"
    done

    # wait (bounded) until every avahi reports startup complete
    for i in $(seq 1 "$n"); do
        for _ in $(seq 1 100); do
            grep -q "Server startup complete" "$LAB_DIR/h$i/avahi.log" 2>/dev/null && break
            sleep 0.1
        done
        grep -q "Server startup complete" "$LAB_DIR/h$i/avahi.log" \
            || { cat "$LAB_DIR/h$i/avahi.log" >&2; die "avahi on host $i did not start within 10 s"; }
    done
    trap - EXIT
    status
}

# pids of all processes inside our host namespaces
lab_pids() {
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-h[0-9]+\$" || true); do
        ip netns pids "$ns" 2>/dev/null || true
    done
}

down() {
    local n i pid f
    n=$(lab_count)
    for i in $(seq 1 "$n"); do
        for f in avahi.pid dbus.pid; do
            pid=$(cat "$LAB_DIR/h$i/$f" 2>/dev/null || true)
            if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
        done
    done
    # anything else still running inside our namespaces (e.g. a test program left behind)
    for pid in $(lab_pids); do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 30); do
        [ -z "$(lab_pids)" ] && break
        sleep 0.1
    done
    for pid in $(lab_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 20); do
        [ -z "$(lab_pids)" ] && break
        sleep 0.1
    done
    [ -z "$(lab_pids)" ] || echo "netlab: warning: processes still in the lab: $(lab_pids | tr '\n' ' ')" >&2
    for i in $(seq 1 "$n"); do
        umount "$(mnt_file "$i")" 2>/dev/null || true
    done
    local ns
    for ns in $(lab_namespaces); do
        ip netns del "$ns" 2>/dev/null || echo "netlab: warning: could not delete namespace $ns" >&2
    done
    rm -f "$LAB_DIR/count"
    if mountpoint -q "$LAB_DIR"; then umount "$LAB_DIR" || true; fi
    echo "netlab: lab '$P' down"
}

link_state() {
    local i=$1 state port
    state=$(ip -n "$HUB" -br link show "v$i" 2>/dev/null | awk '{print $2}')
    port=$(ip -n "$HUB" -d link show "v$i" 2>/dev/null | grep -o 'bridge_slave state [a-z]*' | awk '{print $3}')
    if [ "$state" = DOWN ]; then
        echo cut
    elif [ "${port:-forwarding}" != forwarding ]; then
        echo "cut(silent)"
    else
        echo up
    fi
}

status() {
    local n i
    n=$(lab_count)
    [ "$n" -gt 0 ] || { echo "netlab: lab '$P' is down (LAB_DIR=$LAB_DIR)"; return 0; }
    for i in $(seq 1 "$n"); do
        printf 'host%s ns=%s addr=%s link=%s dbus=%s avahi=%s\n' "$i" "$(node_ns "$i")" \
            "$(host_addr "$i")" "$(link_state "$i")" \
            "$(cat "$LAB_DIR/h$i/dbus.pid" 2>/dev/null || echo '?')" \
            "$(in_host "$i" cat /run/avahi-daemon/pid 2>/dev/null || echo '?')"
    done
}

cut() {
    check_host "$1"
    if [ "${2:-}" = --silent ]; then
        # the bridge port stops forwarding (STP is off, so the state can be set by hand)
        bridge -n "$HUB" link set dev "v$1" state 0
    elif [ -z "${2:-}" ]; then
        ip -n "$HUB" link set "v$1" down
    else
        die "usage: $0 cut I [--silent]"
    fi
}

heal() {
    check_host "$1"
    ip -n "$HUB" link set "v$1" up
    bridge -n "$HUB" link set dev "v$1" state 3
}

# selftest helpers: one check = one line
PASSED=0
FAILED=0
check() {
    local name=$1
    shift
    if "$@"; then
        echo "selftest: ok    $name"
        PASSED=$((PASSED + 1))
    else
        echo "selftest: FAIL  $name"
        FAILED=$((FAILED + 1))
    fi
}
ping_ok() { in_host "$1" ping -q -c 1 -W 1 "$(host_addr "$2")" >/dev/null 2>&1; }
ping_eventually() {
    local _
    for _ in 1 2 3 4 5; do ping_ok "$@" && return 0; done
    return 1
}
ping_fails() { ! ping_ok "$@"; }
browse_finds_host1() {
    local out line
    out=$(in_host 2 timeout 10 avahi-browse -rpt _peerlink._tcp 2>/dev/null || true)
    while IFS= read -r line; do echo "    $line"; done <<<"$out"
    echo "$out" | grep -qx '=;eth0;IPv4;lab-selftest;_peerlink._tcp;local;host1.local;10.99.0.11;7000;"key=value"'
}
nothing_left() {
    [ -z "$(lab_namespaces)" ] && ! mountpoint -q "$LAB_DIR" && [ ! -e "$LAB_DIR/count" ]
}

selftest() {
    command -v ping >/dev/null || die "selftest needs ping (apt-get install iputils-ping, or Hardware/setup.sh --tests)"
    up 2
    trap 'echo "netlab: selftest aborted, tearing down" >&2; down' EXIT
    in_host 1 avahi-publish -s "lab-selftest" _peerlink._tcp 7000 key=value \
        </dev/null >"$LAB_DIR/selftest-pub.log" 2>&1 &
    local pub=$!
    sleep 1.5
    check "mDNS: host2 browses+resolves a service published on host1" browse_finds_host1
    kill "$pub" 2>/dev/null || true
    wait "$pub" 2>/dev/null || true
    check "addr 1 is 10.99.0.11" [ "$(bash "$0" addr 1)" = 10.99.0.11 ]
    check "ping host2 -> host1" ping_eventually 2 1
    cut 1
    check "cut 1: ping host2 -> host1 fails" ping_fails 2 1
    check "cut 1: status shows it" [ "$(link_state 1)" = cut ]
    heal 1
    check "heal 1: ping host2 -> host1 again" ping_eventually 2 1
    cut 1 --silent
    check "cut 1 --silent: ping host2 -> host1 fails" ping_fails 2 1
    check "cut 1 --silent: host1 keeps its carrier" \
        in_host 1 grep -qx 1 /sys/class/net/eth0/carrier
    heal 1
    check "heal 1: ping host2 -> host1 again" ping_eventually 2 1
    check "root namespace has no lab interfaces" sh -c '! ip -br link | grep -qE "^(v[0-9]+|br0)[@ ]"'
    trap - EXIT
    down
    check "down leaves no namespaces and no mount" nothing_left
    echo "selftest: $PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
}

cmd=${1:-}
shift || true
case "$cmd" in
    up) up "$@" ;;
    down) down ;;
    exec) [ $# -ge 2 ] || die "usage: $0 exec I CMD..."; check_host "$1"; i=$1; shift; in_host "$i" "$@" ;;
    addr) [ $# -eq 1 ] || die "usage: $0 addr I"; check_host "$1"; host_addr "$1" ;;
    cut) [ $# -ge 1 ] || die "usage: $0 cut I [--silent]"; cut "$@" ;;
    heal) [ $# -eq 1 ] || die "usage: $0 heal I"; heal "$1" ;;
    status) status ;;
    selftest) selftest ;;
    -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
esac
