#!/bin/sh
# btvm guest/bluetoothd-deaf.sh: guest-side, run by Hardware/bluetooth-lab.sh after tests failed.
# Exits 0, after printing the end of bluetoothd's log and of the kernel's, when bluetoothd is
# running but does not answer a D-Bus call within 10 s (every PeerLink call to it then fails
# with "bluetoothd did not answer …"); exits 1 when it answers, or is not running (the lab
# reports a bluetoothd that died on its own).
# Seen once (2026-11-27, a CI run): after two tests of BluetoothDiscoveryLabTests bluetoothd
# answered no call for the rest of the boot, with no fault in the guest kernel's log that the
# lab looks for.
pidfile=/run/btvm/bluetoothd.pid
[ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || exit 1
if dbus-send --system --print-reply --reply-timeout=10000 --dest=org.bluez / \
    org.freedesktop.DBus.ObjectManager.GetManagedObjects > /dev/null 2>&1; then
  exit 1
fi
echo "bluetooth lab: bluetoothd is running but answered no D-Bus call within 10 s; the end of its log:"
tail -n 40 /run/btvm/bluetoothd.log
echo "bluetooth lab: the end of the guest kernel's log:"
dmesg | tail -n 40
exit 0
