#!/bin/sh
# btvm guest/controllers-gone.sh: guest-side, run by Hardware/bluetooth-lab.sh.
#
# With --watch (started beside the tests, killed after them): every half second, counts the
# emulated controllers the kernel has registered; when there are fewer than it was started
# with, and no guest/renew-controllers.sh is re-creating them on purpose, writes the time,
# btvirt's state and log and the end of the kernel's log to /run/btvm/controllers-gone.log,
# once per disappearance.
#
# Without it (after tests failed): exits 0, after printing what the watcher wrote (or, with no
# watcher, btvirt's state and log and the kernel's), when the emulated controllers went away at
# some point of the run (btvirt stopped, or fewer controllers registered than it was started
# with): every test after that fails with "bluetoothd has no adapter". Exits 1 when they were
# there throughout (the failure is the tests' own).
#
# Seen twice: once (2026-11-27, a CI run) after the first test of BluetoothPairingLabTests
# passed, bluetoothd had neither hci0 nor hci1 for the rest of the boot, bluetoothd itself
# answering; four more boots of the same suite passed. Once (2026-11-29, a CI run) in
# BluetoothDiscoveryLabTests, between an advertiser's start on hci0 and a scan from hci1 (the
# kernel had neither controller). The suite's last tests re-create the controllers
# (guest/renew-controllers.sh), so a look at the state after the tests finds them there and
# says the failure is the tests' own: hence the watcher, which sees them go when they go.
# Usage: controllers-gone.sh [--watch] [ncontrollers]   (default 2)
LOG=/run/btvm/controllers-gone.log
WATCH=0
[ "${1:-}" = --watch ] && { WATCH=1; shift; }
N=${1:-2}

# registered controllers (hciN, not their connections hciN:M), without a process per call
registered() {
  count=0
  for entry in /sys/class/bluetooth/hci*; do
    case ${entry##*/} in
      *:*|'hci*') ;;
      *) count=$((count + 1)) ;;
    esac
  done
  echo $count
}

# a guest/renew-controllers.sh at work (it writes its process id there)
renewing() { [ -s /run/btvm/renewing ] && kill -0 "$(cat /run/btvm/renewing)" 2>/dev/null; }

btvirt_alive() { [ -s /run/btvm/btvirt.pid ] && kill -0 "$(cat /run/btvm/btvirt.pid)" 2>/dev/null; }

# what is worth having when they are gone: how many are left, btvirt's state and log, the kernel's
state_report() {
  if btvirt_alive; then state="runs"; else state="is not running"; fi
  echo "bluetooth lab: the emulated controllers went away at $(cut -d' ' -f1 /proc/uptime) s of uptime ($1 of $N registered; btvirt $state); btvirt's log:"
  tail -n 20 /run/btvm/btvirt.log 2>/dev/null
  echo "bluetooth lab: the end of the guest kernel's log:"
  dmesg | tail -n 40
}

if [ $WATCH = 1 ]; then
  : > $LOG
  gone=0
  while :; do
    now=$(registered)
    if [ "$now" -lt "$N" ] && ! renewing; then
      # a second look, so that a renewal that began between the two reads is not taken for it
      sleep 0.2
      now=$(registered)
      if [ $gone = 0 ] && [ "$now" -lt "$N" ] && ! renewing; then
        state_report "$now" >> $LOG
        gone=1
      fi
    elif [ "$now" -ge "$N" ]; then
      gone=0
    fi
    sleep 0.5
  done
fi

if [ -s $LOG ]; then
  cat $LOG
  now=$(registered)
  [ "$now" -ge "$N" ] && echo "bluetooth lab: (they were there again at the end: $now registered)"
  exit 0
fi
now=$(registered)
btvirt_alive && [ "$now" -ge "$N" ] && exit 1
state_report "$now"
exit 0
