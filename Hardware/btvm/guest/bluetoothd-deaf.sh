#!/bin/sh
# btvm guest/bluetoothd-deaf.sh: guest-side, run by Hardware/bluetooth-lab.sh after tests failed.
# Exits 0, after printing what bluetoothd was doing, the end of its log and of the kernel's, when
# bluetoothd is running but does not answer a D-Bus call within 10 s (every PeerLink call to it
# then fails with "bluetoothd did not answer …"); exits 1 when it answers, or is not running (the
# lab reports a bluetoothd that died on its own).
# Seen twice (2026-11-27, 2026-11-29, CI runs): after the first two tests of
# BluetoothDiscoveryLabTests (a scan, then `advertise` browsed by sdptool) bluetoothd answered no
# call for the rest of the boot, with nothing in its log after start-up and no fault in the guest
# kernel's log. Reproduced once locally (one round in 26 of the suite's first three tests): bluetoothd
# was in accept(2) on one of its own L2CAP listening sockets (see ../README.md, "Kernel faults"):
# its SDP server, PSM 1, as a CI run of 2026-12-06 showed. guest/bluetoothd-accept.py --watch now
# frees that wait under the tests; this still reports a bluetoothd deaf for that or any reason.
# What follows tells each sighting apart: whether the bus itself still answers, where bluetoothd's
# one thread waits (its state, wait channel, system call and kernel stack), and the kernel's
# blocked tasks.
pidfile=/run/btvm/bluetoothd.pid
[ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || exit 1
if dbus-send --system --print-reply --reply-timeout=10000 --dest=org.bluez / \
    org.freedesktop.DBus.ObjectManager.GetManagedObjects > /dev/null 2>&1; then
  exit 1
fi
pid=$(cat "$pidfile")
echo "bluetooth lab: bluetoothd is running but answered no D-Bus call within 10 s"
if dbus-send --system --print-reply --reply-timeout=5000 --dest=org.freedesktop.DBus / \
    org.freedesktop.DBus.GetNameOwner string:org.bluez > /dev/null 2>&1; then
  echo "bluetooth lab: the system bus answers, and org.bluez has an owner: bluetoothd itself is stuck"
else
  echo "bluetooth lab: the system bus itself does not answer (or org.bluez has no owner)"
fi
echo "bluetooth lab: bluetoothd (pid $pid): $(grep -E '^State' "/proc/$pid/status" | tr -s '\t ' ' ')," \
  "waiting in $(cat "/proc/$pid/wchan" 2>/dev/null), system call $(cut -d' ' -f1-3 "/proc/$pid/syscall" 2>/dev/null)"
cat "/proc/$pid/stack" 2>/dev/null | sed 's/^/  /'
# which listener, when it is accept(2) (guest/bluetoothd-accept.py frees it live under the tests)
echo "bluetooth lab: $(/usr/bin/python3 "$(dirname "$0")/bluetoothd-accept.py" --describe)"
echo "bluetooth lab: bluetoothd's descriptors:"
ls -l "/proc/$pid/fd" 2>/dev/null | sed -n 's/.* \([0-9]*\) -> /  \1 -> /p' | sort -n
echo "bluetooth lab: the end of bluetoothd's log:"
tail -n 40 /run/btvm/bluetoothd.log
# The kernel's list of tasks in uninterruptible sleep, with their stacks, goes to its log: a
# bluetoothd waiting on a lock some other task holds shows there with the holder.
[ -w /proc/sysrq-trigger ] && echo w > /proc/sysrq-trigger
echo "bluetooth lab: the end of the guest kernel's log (with its blocked tasks):"
dmesg | tail -n 80
exit 0
