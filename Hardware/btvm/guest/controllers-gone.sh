#!/bin/sh
# btvm guest/controllers-gone.sh: guest-side, run by Hardware/bluetooth-lab.sh after tests failed.
# Exits 0, after printing btvirt's state and log and the end of the kernel's log, when the
# emulated controllers are gone (btvirt no longer runs, or fewer controllers are registered
# than it was started with): every test after that fails with "bluetoothd has no adapter".
# Exits 1 when they are all there (the failure is the tests' own).
# Seen once (2026-11-27, a CI run): after the first test of BluetoothPairingLabTests passed,
# bluetoothd had neither hci0 nor hci1 for the rest of the boot, bluetoothd itself answering;
# four more boots of the same suite passed.
# Usage: controllers-gone.sh [ncontrollers]   (default 2)
N=${1:-2}
registered=$(ls /sys/class/bluetooth 2>/dev/null | grep -c '^hci[0-9]*$')
alive=1
[ -s /run/btvm/btvirt.pid ] && kill -0 "$(cat /run/btvm/btvirt.pid)" 2>/dev/null || alive=0
[ "$alive" = 1 ] && [ "$registered" -ge "$N" ] && exit 1
if [ "$alive" = 1 ]; then state="runs"; else state="is not running"; fi
echo "bluetooth lab: the emulated controllers went away ($registered of $N registered; btvirt $state); btvirt's log:"
tail -n 20 /run/btvm/btvirt.log 2>/dev/null
echo "bluetooth lab: the end of the guest kernel's log:"
dmesg | tail -n 40
exit 0
