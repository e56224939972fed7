#!/bin/sh
# btvm guest/pairing-trace.sh: guest-side, run by Hardware/bluetooth-lab.sh around the tests that
# must meet controllers that never paired (BluetoothFreshLabTests).
#   pairing-trace.sh start   btmon records the controllers' HCI traffic (/run/btvm/btmon.log)
#   pairing-trace.sh print   stops it and prints the connection and pairing events: which ACL
#                            links came and went, the IO capabilities and authentication
#                            requirements each side gave, whether each new link key was to be
#                            stored (a bond) or not, encryption and its key size, the L2CAP
#                            channels opened and closed; then the kernel's Bluetooth messages
#   pairing-trace.sh stop    stops it
# Why: btvirt keeps a one-sided bond when it skips a pairing's IO capability exchange (see
# forget-bonds.py); a fresh boot should pair exactly once, and when a test there still finds a
# bond, these events say which pairing left it. Without btmon both do nothing.
LOG=/run/btvm/btmon.log
PID=/run/btvm/btmon.pid
command -v btmon >/dev/null 2>&1 || exit 0
case "${1:-}" in
    start)
        btmon -t > "$LOG" 2>&1 &
        echo $! > "$PID"
        sleep 1 ;;
    stop)
        [ -s "$PID" ] && kill "$(cat "$PID")" 2>/dev/null ;;
    print)
        sleep 1
        [ -s "$PID" ] && kill "$(cat "$PID")" 2>/dev/null
        echo "bluetooth lab: the controllers' connection and pairing events (btmon):"
        awk '/^[<>@=] / { keep = ($0 ~ /Connect Complete|Disconnect|Authentication Requested|Auth Complete|IO Capability|Link Key|Simple Pairing Complete|User Confirmation|Encrypt|Key Size|Command Status|L2CAP: Connection|L2CAP: Disconnection|Security/) } keep' "$LOG" | head -n 400
        # the kernel's word on a link it dropped (a key size it could not read, a security check)
        echo "bluetooth lab: the kernel's Bluetooth messages:"
        dmesg | grep -i 'bluetooth' | tail -n 30 ;;
    *)
        echo "usage: pairing-trace.sh start|stop|print" >&2
        exit 2 ;;
esac
