#!/bin/sh
# btvm guest/renew-controllers.sh: creates the virtual controllers afresh, with the same
# addresses, for a test that must meet controllers that never paired.
#
# btvirt's emulated controllers remember the IO capability a host gave in one pairing and skip
# the IO capability exchange in later ones; from the second pairing on, links between them are
# cut a few seconds after they opened, or their pairing is refused. New controllers pair
# faithfully again. So this stops btvirt (the kernel drops hci0, hci1, ... and bluetoothd its
# adapters), removes what bluetoothd stored about devices (bonds), starts btvirt again and waits
# until bluetoothd, when it runs, has every adapter powered. Run it as root with no program
# using the adapters.
# Usage: renew-controllers.sh [ncontrollers]   (default 2)
N=${1:-2}
G=$(cd "$(dirname "$0")" && pwd)
say() { echo "renew-controllers: $*" >&2; }
registered() { ls /sys/class/bluetooth 2>/dev/null | grep -c '^hci[0-9]*$'; }
# tells guest/controllers-gone.sh --watch that the controllers go away on purpose
echo $$ > /run/btvm/renewing
# in btvirt's log too, beside the lines that say how each btvirt ended: a renewal with no end
# line there was itself killed (so the controllers it stopped were never started again)
uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "== renewal (pid $$) started at $(uptime_s) s of uptime" >> /run/btvm/btvirt.log
ended() {
  status=$?
  rm -f /run/btvm/renewing
  echo "== renewal (pid $$) ended at $(uptime_s) s of uptime (status $status)" >> /run/btvm/btvirt.log
}
trap ended EXIT
kill "$(cat /run/btvm/btvirt.pid 2>/dev/null)" 2>/dev/null
i=0
while [ "$(registered)" -gt 0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
[ "$(registered)" -eq 0 ] || { say "the old controllers did not go away"; exit 1; }
# bluetoothd loads an adapter's devices from here when the adapter comes (back)
for adapter in /var/lib/bluetooth/*:*; do
  [ -d "$adapter" ] || continue
  for device in "$adapter"/*:*; do [ -e "$device" ] && rm -rf "$device"; done
  rm -rf "$adapter/cache"
done
bluetoothd=0
[ -s /run/btvm/bluetoothd.pid ] && kill -0 "$(cat /run/btvm/bluetoothd.pid)" 2>/dev/null && bluetoothd=1
if [ $bluetoothd = 1 ]; then
  sh "$G/bt-setup.sh" "$N" bluetoothd || exit 1
else
  sh "$G/bt-setup.sh" "$N" kernel || exit 1
  exit 0
fi
powered_adapters() {
  dbus-send --system --print-reply --dest=org.bluez / org.freedesktop.DBus.ObjectManager.GetManagedObjects 2>/dev/null \
    | awk '/string "org.bluez.Adapter1"/ { a = 1 } a && /string "Powered"/ { p = 1; next } p { if (/boolean true/) n++; p = 0 } END { print n + 0 }'
}
i=0
while [ "$(powered_adapters)" -lt "$N" ]; do
  i=$((i+1))
  [ $i -lt 300 ] || { say "bluetoothd has $(powered_adapters) of $N adapters powered after 30 s"; exit 1; }
  sleep 0.1
done
