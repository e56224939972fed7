#!/bin/sh
# btvm guest/accept-stuck-test.sh: guest-side self-test of guest/bluetoothd-accept.py (run it with
# `run.sh --bluetoothd`). Leaves bluetoothd in accept(2) on its SDP listener with no connection to
# take, as the CI runs saw it, and checks that --describe finds the listener, that bluetoothd
# answers no D-Bus call meanwhile, that --free ends the wait and that bluetoothd answers again.
#
# How it gets there: strace holds bluetoothd at the entry of its next accept(2) for 3 s; an SDP
# connection from hci1 wakes the loop (it is held open for a second, so that the listener polls
# readable) and is closed while the accept is held, so the accept, once entered, finds nothing to
# take.
G=$(cd "$(dirname "$0")" && pwd)
fail() { echo "accept-stuck-test: FAIL: $*"; [ -s /run/btvm/accept-stuck-strace.log ] && sed "s/^/  strace: /" /run/btvm/accept-stuck-strace.log; exit 1; }
answers() {
  dbus-send --system --print-reply --reply-timeout="$1" --dest=org.bluez / \
    org.freedesktop.DBus.ObjectManager.GetManagedObjects > /dev/null 2>&1
}
command -v strace > /dev/null || fail "needs strace, which the lab does not install: apt-get install -y strace"
pid=$(cat /run/btvm/bluetoothd.pid 2>/dev/null) && kill -0 "$pid" 2>/dev/null || fail "no bluetoothd (run.sh --bluetoothd)"
answers 5000 || fail "bluetoothd does not answer to begin with"
/usr/bin/python3 "$G/bluetoothd-accept.py" --describe > /dev/null && fail "--describe says bluetoothd waits in accept(2) before the test"

stuck() {
  # as a PeerLink advertiser leaves it: hci0 takes connections while the SDP one is made, then not
  hciconfig hci0 pscan || fail "hciconfig hci0 pscan"
  strace -q -p "$pid" -e trace=accept,accept4 -e inject=accept,accept4:delay_enter=3000000 -o /run/btvm/accept-stuck-strace.log &
  tracer=$!
  sleep 1
  /usr/bin/python3 -c "$connect_and_close" "$(cat /run/btvm/addr_hci1)" "$(cat /run/btvm/addr_hci0)" || fail "no SDP connection from hci1 to hci0"
  hciconfig hci0 noscan
  sleep 4
  kill "$tracer"; wait "$tracer" 2>/dev/null
  sleep 0.5
}
connect_and_close='
import socket, sys, time
s = socket.socket(socket.AF_BLUETOOTH, socket.SOCK_SEQPACKET, socket.BTPROTO_L2CAP)
s.settimeout(10)
s.bind((sys.argv[1], 0))
s.connect((sys.argv[2], 1))
time.sleep(1)
s.close()
'

stuck
out=$(/usr/bin/python3 "$G/bluetoothd-accept.py" --describe) || fail "--describe: $out"
echo "accept-stuck-test: $out"
case $out in *"L2CAP PSM 1 of"*) ;; *) fail "not the SDP listener (PSM 1)" ;; esac
answers 2000 && fail "bluetoothd answered while in accept(2): the test did not leave it there"
out=$(/usr/bin/python3 "$G/bluetoothd-accept.py" --free) || fail "--free: $out"
echo "accept-stuck-test: $out"
answers 5000 || fail "bluetoothd does not answer after --free"
hciconfig hci0 | grep -q PSCAN && fail "--free left hci0 taking connections"

# the same again with --watch running, as beside the lab's tests: it frees bluetoothd by itself
rm -f /run/btvm/bluetoothd-accept.log
/usr/bin/python3 "$G/bluetoothd-accept.py" --watch &
watcher=$!
stuck
answers 15000 || { kill $watcher; fail "bluetoothd does not answer with --watch running"; }
kill $watcher
grep -q "freed it" /run/btvm/bluetoothd-accept.log || fail "--watch wrote no line saying it freed bluetoothd"
echo "accept-stuck-test: --watch: $(cat /run/btvm/bluetoothd-accept.log)"
echo "accept-stuck-test: PASS"
