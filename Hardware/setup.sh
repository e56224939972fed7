#!/usr/bin/env bash
# setup.sh — idempotent installer of everything PeerLink needs on Debian / Ubuntu / Raspberry Pi OS.
#
# usage: Hardware/setup.sh [--tests]
#   (no option)  build/run dependencies: libavahi-client-dev libbluetooth-dev libdbus-1-dev avahi-daemon
#                avahi-utils dbus bluez iproute2 pkg-config, and a check that Swift 6.2+ is present
#   --tests      also what the test suite needs: python3, tcpdump, ping, a Python with the `zeroconf`
#                and `noiseprotocol` packages (system python3 if it already has them, otherwise a
#                venv in ${XDG_CACHE_HOME:-$HOME/.cache}/peerlink/venv), and on x86_64 the packages
#                of the Bluetooth VM lab (skip those with PEERLINK_SKIP_BTVM=1)
#
# Installs only packages that dpkg-query reports missing (apt-get, through sudo when not root;
# `apt-get update` runs at most once, and only if something must be installed).
# With CI=true and no /usr/sbin/policy-rc.d, a temporary policy-rc.d (exit 101) is in place
# during the install, so installing avahi-daemon can never start a daemon on a real interface.
# With --tests the last line printed is `PEERLINK_PYTHON=/path/to/python3`; the same path is
# written to ${XDG_CACHE_HOME:-$HOME/.cache}/peerlink/python.
# Apt output goes to a log file (its path is printed if apt-get fails).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
say() { echo "peerlink setup: $*"; }
die() { echo "peerlink setup: error: $*" >&2; exit 1; }

WANT_TESTS=0
for arg in "$@"; do
    case "$arg" in
        --tests) WANT_TESTS=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "peerlink setup: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
    esac
done

CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/peerlink
VENV_DIR=$CACHE_DIR/venv

BASE_PACKAGES="libavahi-client-dev libbluetooth-dev libdbus-1-dev avahi-daemon avahi-utils dbus bluez iproute2 pkg-config"
TEST_PACKAGES="python3 tcpdump iputils-ping"
# The Bluetooth VM lab (QEMU guest with btvirt controllers, see ../shared/tools/btvm); x86_64 only.
BTVM_PACKAGES="qemu-system-x86 linux-image-amd64 busybox-static bluez-test-tools cpio python3-dbus python3-gi"

# ---------------------------------------------------------------------------------------------
# Swift

find_swift() {
    if command -v swift >/dev/null 2>&1; then
        command -v swift
    elif [ -x /opt/swift/usr/bin/swift ]; then
        echo /opt/swift/usr/bin/swift
    else
        return 1
    fi
}

check_swift() {
    local swift version major minor
    if ! swift=$(find_swift); then
        cat >&2 <<'EOF'
peerlink setup: error: `swift` was not found (looked on PATH and in /opt/swift/usr/bin).
  PeerLink needs Swift 6.2 or newer. Install it from https://www.swift.org/install/linux/
  (or with swiftly: https://www.swift.org/install/linux/swiftly/), make sure `swift` is on
  your PATH, then run this script again.
EOF
        exit 1
    fi
    version=$("$swift" --version 2>/dev/null | sed -n 's/.*Swift version \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p' | head -n 1)
    if [ -n "$version" ]; then
        major=${version%%.*}
        minor=${version#*.}
        if [ "$major" -lt 6 ] || { [ "$major" -eq 6 ] && [ "$minor" -lt 2 ]; }; then
            die "found Swift $version at $swift; PeerLink needs Swift 6.2 or newer (https://www.swift.org/install/linux/ or swiftly)"
        fi
    fi
    case ":$PATH:" in
        *":$(dirname "$swift"):"*) say "swift ${version:-(unknown version)} at $swift" ;;
        *) say "swift ${version:-(unknown version)} at $swift (not on PATH; add $(dirname "$swift") to PATH)" ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# Packages

is_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

# Run a command as root (directly, or through sudo).
as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "must run as root to install packages (no sudo found): $*"
    fi
}

APT_LOG=""
APT_UPDATED=0
TEMP_POLICY=0

# (not called in $(...): the assignment must stick, so that cleanup finds the file)
ensure_apt_log() {
    if [ -z "$APT_LOG" ]; then
        APT_LOG=$(mktemp "${TMPDIR:-/tmp}/peerlink-setup-apt.XXXXXX")
    fi
}

remove_temp_policy() {
    if [ "$TEMP_POLICY" = 1 ]; then
        as_root rm -f /usr/sbin/policy-rc.d
        TEMP_POLICY=0
    fi
}

cleanup() {
    remove_temp_policy
    # keep the apt log only when something failed
    if [ -n "$APT_LOG" ] && [ "${SETUP_OK:-0}" = 1 ]; then
        rm -f "$APT_LOG"
    fi
}
trap cleanup EXIT

apt_update_once() {
    [ "$APT_UPDATED" = 1 ] && return 0
    ensure_apt_log
    say "running apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$APT_LOG" 2>&1 \
        || die "apt-get update failed (log: $APT_LOG)"
    APT_UPDATED=1
}

# Packages (of the arguments) that dpkg does not report installed.
missing_of() {
    local p out=""
    for p in "$@"; do
        is_installed "$p" || out="$out $p"
    done
    echo "${out# }"
}

# Install the given packages (all assumed missing).
apt_install() {
    [ $# -gt 0 ] || return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        die "this is not a Debian-like system (no apt-get); install these yourself: $*"
    fi
    ensure_apt_log
    apt_update_once
    if [ "${CI:-}" = true ] && [ ! -e /usr/sbin/policy-rc.d ]; then
        # keep package scripts from starting services (avahi-daemon on all interfaces!)
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod 755 /usr/sbin/policy-rc.d
        TEMP_POLICY=1
    fi
    say "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$APT_LOG" 2>&1 \
        || die "apt-get install $* failed (log: $APT_LOG)"
    remove_temp_policy
}

# Packages of the Bluetooth VM lab for this machine, or nothing if it does not apply.
btvm_packages() {
    if [ "${PEERLINK_SKIP_BTVM:-0}" = 1 ] || [ "$(uname -m)" != x86_64 ]; then
        return 0
    fi
    local list=$BTVM_PACKAGES id=""
    if [ -r /etc/os-release ]; then
        # shellcheck disable=SC1091
        id=$(. /etc/os-release && echo "${ID:-}")
    fi
    # Ubuntu has no linux-image-amd64 meta package
    [ "$id" = ubuntu ] && list=${list/linux-image-amd64/linux-image-generic}
    echo "$list"
}

# ---------------------------------------------------------------------------------------------
# Python for the interop tests

python_has_modules() {
    "$1" -c 'import zeroconf, noise' >/dev/null 2>&1
}

setup_python() {
    local py
    if command -v python3 >/dev/null 2>&1 && python_has_modules python3; then
        # the real interpreter, not a pyenv shim, so it works whatever PATH the tests see
        py=$(python3 -c 'import sys; print(sys.executable)')
        say "python3 has zeroconf and noiseprotocol"
    elif [ -x "$VENV_DIR/bin/python3" ] && python_has_modules "$VENV_DIR/bin/python3"; then
        py=$VENV_DIR/bin/python3
        say "using venv $VENV_DIR"
    else
        command -v python3 >/dev/null 2>&1 || die "python3 not found"
        if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
            # Debian's python3 without python3-venv cannot create a venv with pip
            is_installed python3-venv && die "python3 cannot create a venv (no ensurepip) although python3-venv is installed"
            apt_install python3-venv
        fi
        say "creating venv $VENV_DIR with zeroconf and noiseprotocol"
        rm -rf "$VENV_DIR"
        mkdir -p "$CACHE_DIR"
        python3 -m venv "$VENV_DIR" || die "python3 -m venv $VENV_DIR failed"
        "$VENV_DIR/bin/python3" -m pip install --quiet --disable-pip-version-check zeroconf noiseprotocol \
            || die "pip install zeroconf noiseprotocol failed"
        python_has_modules "$VENV_DIR/bin/python3" || die "venv python cannot import zeroconf and noise"
        py=$VENV_DIR/bin/python3
    fi
    mkdir -p "$CACHE_DIR"
    echo "$py" >"$CACHE_DIR/python"
    PEERLINK_PYTHON=$py
}

# ---------------------------------------------------------------------------------------------

check_swift

command -v dpkg-query >/dev/null 2>&1 \
    || die "this is not a Debian-like system (no dpkg-query); install the equivalents of: $BASE_PACKAGES"

wanted=$BASE_PACKAGES
[ "$WANT_TESTS" = 1 ] && wanted="$wanted $TEST_PACKAGES"
# shellcheck disable=SC2086 # word splitting of the package lists is intended
missing=$(missing_of $wanted)

btvm_missing=""
if [ "$WANT_TESTS" = 1 ]; then
    # shellcheck disable=SC2046
    btvm_missing=$(missing_of $(btvm_packages))
fi

if [ -z "$missing" ] && [ -z "$btvm_missing" ]; then
    say "all packages present"
else
    # shellcheck disable=SC2086
    apt_install $missing
    if [ -n "$btvm_missing" ]; then
        # The VM lab is optional: install what this distribution has, warn about the rest.
        apt_update_once
        available=""
        for p in $btvm_missing; do
            if apt-cache show --no-all-versions "$p" >/dev/null 2>&1; then
                available="$available $p"
            else
                say "warning: package $p is not available here; the Bluetooth VM lab will not run"
            fi
        done
        # shellcheck disable=SC2086
        apt_install $available
    fi
fi

if [ "$WANT_TESTS" = 1 ]; then
    setup_python
fi
SETUP_OK=1
if [ "$WANT_TESTS" = 1 ]; then
    echo "PEERLINK_PYTHON=$PEERLINK_PYTHON"
fi
