# lab-common.sh — what Hardware/bluetooth-lab.sh and Hardware/bluetooth-bench.sh share: the
# checks that the VM lab can run here, the build directory, and booting the VM (once more when
# its set-up fails). Sourced, not run; the caller defines say() and sets HERE (this folder).

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH=/opt/swift/usr/bin:$PATH
fi

# lab_require TOOL...: exits 77 saying what is missing, instead of failing inside the VM.
lab_require() {
    cannot_run() { say "cannot run here: $*"; exit 77; }
    [ "$(uname -m)" = x86_64 ] || cannot_run "the VM lab needs an x86-64 machine (this is $(uname -m))"
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || [ -x "/usr/libexec/bluetooth/$tool" ] \
            || cannot_run "$tool is missing: run Hardware/setup.sh --tests (it installs the lab's packages)"
    done
    [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] \
        || cannot_run "busybox is missing: run Hardware/setup.sh --tests (it installs busybox-static)"
    compgen -G "/boot/vmlinuz-*" >/dev/null \
        || cannot_run "no kernel in /boot: run Hardware/setup.sh --tests (it installs linux-image-amd64)"
}

# The build directory, and swift's option for it.
SCRATCH=${PEERLINK_SCRATCH_PATH:-.build}
scratch=()
[ -n "${PEERLINK_SCRATCH_PATH:-}" ] && scratch=(--scratch-path "$PEERLINK_SCRATCH_PATH")

# lab_boot GUEST_CMD [RUN.SH OPTIONS...]: runs GUEST_CMD (sh -c, in this directory) in the VM;
# the guest's set-up (btvirt, bluetoothd) can miss its deadlines under emulation on a busy
# machine, so a set-up failure (exit 125) gets one more boot. Sets LAB_RC to the exit status.
lab_boot() {
    local cmd=$1
    shift
    LAB_RC=0
    BTVM_TIME=1 "$HERE/btvm/run.sh" "$@" --timeout "${PEERLINK_LAB_TIMEOUT:-900}" -- "$cmd" || LAB_RC=$?
    if [ "$LAB_RC" = 125 ]; then
        say "the VM's set-up failed (exit 125); booting it once more"
        LAB_RC=0
        BTVM_TIME=1 "$HERE/btvm/run.sh" "$@" --timeout "${PEERLINK_LAB_TIMEOUT:-900}" -- "$cmd" || LAB_RC=$?
    fi
    if [ "$LAB_RC" = 125 ]; then
        say "the VM did not start: rerun with --console, or see Hardware/btvm/README.md"
    fi
}
