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
# machine, so a set-up failure (exit 125) gets one more boot. Sets LAB_RC to the exit status,
# and LAB_KERNEL_FAULT to 1 when the guest kernel faulted in the boot that counted (run.sh has
# printed its report; exit 123 when the command did not end after it), else 0.
lab_boot() {
    local cmd=$1 report
    shift
    report=$(mktemp)
    LAB_RC=0
    BTVM_FAULT_REPORT=$report BTVM_TIME=1 "$HERE/btvm/run.sh" "$@" --timeout "${PEERLINK_LAB_TIMEOUT:-900}" -- "$cmd" || LAB_RC=$?
    if [ "$LAB_RC" = 125 ]; then
        say "the VM's set-up failed (exit 125); booting it once more"
        LAB_RC=0
        : > "$report"
        BTVM_FAULT_REPORT=$report BTVM_TIME=1 "$HERE/btvm/run.sh" "$@" --timeout "${PEERLINK_LAB_TIMEOUT:-900}" -- "$cmd" || LAB_RC=$?
    fi
    if [ "$LAB_RC" = 125 ]; then
        say "the VM did not start: rerun with --console, or see Hardware/btvm/README.md"
    fi
    LAB_KERNEL_FAULT=0
    if [ -s "$report" ]; then
        LAB_KERNEL_FAULT=1
        say "the guest kernel faulted in this boot ($(grep -m1 -E 'BUG|Oops|corruption|fault|panic' "$report" | sed 's/^\[ *[0-9.]*\] //')): its report is above"
    fi
    rm -f "$report"
}

# lab_measure_boots N K: boots the VM N times with bluetoothd, K CPU-bound processes beside it,
# and prints what each boot's set-up did; returns 1 if any boot failed to set up.
lab_measure_boots() {
    local boots=$1 load=$2 i rc out tries setup wall failed=0 retried=0 loaders=()
    for ((i = 0; i < load; i++)); do
        # bounded: at most an hour, and stopped below
        timeout 3600 sh -c 'while :; do :; done' &
        loaders+=($!)
    done
    # shellcheck disable=SC2317 # invoked by the trap
    stop_loaders() { [ ${#loaders[@]} -gt 0 ] && kill "${loaders[@]}" 2>/dev/null; true; }
    trap stop_loaders EXIT
    say "measuring $boots boots with bluetoothd, $load CPU-bound processes beside the VM ($(nproc) CPUs)"
    printf '%-5s %-7s %-6s %-9s %s\n' boot result tries "set-up" wall
    for ((i = 1; i <= boots; i++)); do
        rc=0
        out=$(BTVM_TIME=1 "$HERE/btvm/run.sh" --bluetoothd --timeout 300 -- \
            'cat /run/btvm/setup-times; hciconfig | grep -c "UP RUNNING"' 2>&1) || rc=$?
        tries=$(echo "$out" | sed -n 's/.*set up in [0-9.]* s (try \([0-9]*\)).*/\1/p' | tail -n 1)
        setup=$(echo "$out" | sed -n 's/.*set up in \([0-9.]*\) s.*/\1/p' | tail -n 1)
        wall=$(echo "$out" | sed -n 's/^run.sh: [a-z]*, \([0-9.]*\)s wall/\1/p' | tail -n 1)
        if [ "$rc" = 0 ] && [ "$(echo "$out" | grep -E '^[0-9]+$' | tail -n 1)" = 2 ]; then
            printf '%-5s %-7s %-6s %-9s %s\n' "$i" ok "${tries:-?}" "${setup:-?} s" "${wall:-?} s"
            [ "${tries:-1}" -gt 1 ] && retried=$((retried + 1))
        else
            failed=$((failed + 1))
            printf '%-5s %-7s %-6s %-9s %s\n' "$i" "FAILED" "${tries:--}" - "${wall:-?} s (exit $rc)"
            echo "$out" | grep -E 'bt-setup|start-bluetoothd|failed|Opcode' | sed 's/^/      /' | head -n 8
        fi
    done
    stop_loaders
    trap - EXIT
    say "$boots boots, $load CPU-bound processes beside: $failed failed to set up, $retried set up after re-creating a controller in the guest"
    [ "$failed" = 0 ]
}
