#!/usr/bin/env bash
# fresh-debian.sh — the README's quick start on a machine that has nothing of PeerLink yet: a
# minimal Debian root (debootstrap --variant=minbase) with only what swift.org asks for beside the
# toolchain, a clone of this repository, and the quick start's commands run in it as root, in a
# mount namespace whose / is that root (so the namespaces the tests make in there see it too).
#
# usage: Hardware/fresh-debian.sh create [RELEASE]   make the root (default bookworm; Swift's
#                                                     prerequisites are swift.org's list for Debian
#                                                     12) and keep a copy of it as it is before
#                                                     PeerLink's setup
#        Hardware/fresh-debian.sh test               reset the root to that copy, clone HEAD into
#                                                     it, run `CI=true bash .ci/run` there
#        Hardware/fresh-debian.sh chat [ARGS...]     reset the root likewise and run
#                                                     Hardware/peerlink.sh ARGS there (interactive)
#        Hardware/fresh-debian.sh shell              a shell in the root as it is now
#        Hardware/fresh-debian.sh remove             delete the root and its copy
# env:   FRESH_DIR (default /var/tmp/peerlink-fresh): the root is FRESH_DIR/root, the copy
#        FRESH_DIR/base; SWIFT_DIR (default: the toolchain of `swift` on PATH, or /opt/swift):
#        mounted read-only at /opt/swift in the root, as swift.org's tarball would be unpacked.
#
# What the root takes from this machine, so that it reaches what this machine reaches (nothing
# of PeerLink's): the apt sources, the CA certificates under /usr/local/share/ca-certificates,
# git's `url.*.insteadOf` rewrites of /etc/gitconfig (a local copy of GitHub's packages) with the
# folders they point to (read-only), and pip's and the TLS stack's certificate settings. The root
# shares this machine's network namespace (and sees its processes): the test command starts
# avahi-daemon there on the loopback interface only, as it does on this machine; do not run it
# beside another test run. Needs root, unshare and pivot_root (util-linux), and debootstrap
# (installed with apt-get when missing).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
say() { echo "fresh-debian: $*"; }
die() { echo "fresh-debian: error: $*" >&2; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
FRESH_DIR=${FRESH_DIR:-/var/tmp/peerlink-fresh}
ROOT=$FRESH_DIR/root
BASE=$FRESH_DIR/base

case "${1:-}" in -h | --help) usage; exit 0 ;; esac
[ "$(id -u)" = 0 ] || die "run as root (mount namespaces, pivot_root, debootstrap)"

swift_dir() {
    if [ -n "${SWIFT_DIR:-}" ]; then
        echo "$SWIFT_DIR"
    elif command -v swift >/dev/null 2>&1; then
        # .../usr/bin/swift -> ...
        dirname "$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")"
    elif [ -x /opt/swift/usr/bin/swift ]; then
        echo /opt/swift
    else
        die "no Swift toolchain found: set SWIFT_DIR to a folder with usr/bin/swift"
    fi
}

# The folders /etc/gitconfig's insteadOf rewrites point to (local copies of remote repositories).
git_mirrors() {
    git config --system --get-regexp '^url\..*\.insteadof$' 2>/dev/null \
        | sed -E 's/^url\.(.*)\.insteadof .*/\1/I' | sort -u | while read -r dir; do
            [ -d "$dir" ] && echo "${dir%/}"
        done
}

# Runs a command in the root, in a mount namespace of its own whose / the root is (pivot_root),
# as / is on a machine: a namespace made in there (netlab.sh's hosts) and entered with nsenter
# sees the root, not this machine's tree. The mounts (proc, sys, /dev, a /run of its own, the
# toolchain and git's mirrors read-only) exist only in that namespace and end with it.
in_root() {
    local mirrors
    mirrors=$(git_mirrors | tr '\n' ' ')
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    unshare --mount --propagation private --fork -- /bin/bash -c '
        set -e
        root=$1 swift=$2 mirrors=$3
        shift 3
        mount --bind "$root" "$root"
        mount -t proc proc "$root/proc"
        mount -t sysfs sysfs "$root/sys"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs tmpfs "$root/run"
        mkdir -p "$root/opt/swift"
        mount --bind "$swift" "$root/opt/swift"
        mount -o remount,bind,ro "$root/opt/swift"
        for dir in $mirrors; do
            mkdir -p "$root$dir"
            mount --bind "$dir" "$root$dir"
            mount -o remount,bind,ro "$root$dir"
        done
        cd "$root"
        mkdir -p .host
        pivot_root . .host
        cd /
        umount -l /.host
        rmdir /.host
        exec /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
            PIP_CERT=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
            SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
    ' fresh-root "$ROOT" "$(swift_dir)" "$mirrors" "$@"
}

# Deletes the root (nothing is mounted in it outside in_root's namespace).
delete_root() {
    rm -rf --one-file-system "$ROOT"
}

create() {
    local release=${1:-bookworm}
    command -v debootstrap >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    [ ! -e "$ROOT" ] || die "$ROOT exists: run '$0 remove' first"
    mkdir -p "$FRESH_DIR"
    local mirror=http://deb.debian.org/debian
    say "debootstrap --variant=minbase $release (log: $FRESH_DIR/debootstrap.log)"
    debootstrap --variant=minbase "$release" "$ROOT" "$mirror" >"$FRESH_DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed (log: $FRESH_DIR/debootstrap.log)"
    if [ -r /etc/apt/sources.list.d/debian.sources ] && grep -q "Suites: $release" /etc/apt/sources.list.d/debian.sources; then
        cp /etc/apt/sources.list.d/debian.sources "$ROOT/etc/apt/sources.list.d/"
        rm -f "$ROOT/etc/apt/sources.list"
    fi
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/" 2>/dev/null || true
    git config --system --get-regexp '^url\..*\.insteadof$' 2>/dev/null \
        | while read -r key value; do git config --file "$ROOT/etc/gitconfig" --add "$key" "$value"; done
    # What swift.org lists for Debian 12 beside the toolchain (the user's part, not PeerLink's).
    say "installing Swift's prerequisites (log: $FRESH_DIR/swift-deps.log)"
    in_root bash -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        binutils gcc git libc6-dev libcurl4-openssl-dev libedit-dev libicu-dev libncurses-dev libpython3-dev \
        libsqlite3-dev libstdc++-12-dev libxml2-dev pkg-config tzdata uuid-dev zlib1g-dev ca-certificates \
        && update-ca-certificates' >"$FRESH_DIR/swift-deps.log" 2>&1 \
        || die "installing Swift's prerequisites failed (log: $FRESH_DIR/swift-deps.log)"
    in_root /opt/swift/usr/bin/swift --version >/dev/null || die "the toolchain does not run in the root"
    say "keeping a copy of the root as it is before PeerLink's setup"
    rm -rf "$BASE"
    cp -a "$ROOT" "$BASE"
    say "ready: $ROOT"
}

reset_and_clone() {
    [ -d "$BASE" ] || die "no root yet: run '$0 create' first"
    delete_root
    cp -a "$BASE" "$ROOT"
    git clone -q "$REPO" "$ROOT/root/peerlink"
    say "cloned $(git -C "$REPO" rev-parse --short HEAD) into $ROOT/root/peerlink"
}

case "${1:-}" in
    create) shift; create "$@" ;;
    test)
        reset_and_clone
        set +e
        in_root env CI=true bash -c 'cd /root/peerlink && bash .ci/run'
        status=$?
        say "the test command exited $status"
        exit "$status"
        ;;
    chat)
        shift
        reset_and_clone
        in_root bash -c 'cd /root/peerlink && exec Hardware/peerlink.sh "$@"' peerlink.sh "$@"
        ;;
    shell)
        [ -d "$ROOT" ] || die "no root yet: run '$0 create' first"
        in_root bash -c 'cd /root/peerlink 2>/dev/null; exec bash -i' || true
        ;;
    remove)
        delete_root
        rm -rf --one-file-system "$BASE"
        say "removed $FRESH_DIR's root and copy"
        ;;
    *) usage >&2; exit 2 ;;
esac
