#!/usr/bin/python3
# btvm guest/forget-bonds.py: guest-side, started by start-bluetoothd.sh for run.sh --forget-bonds.
#
# Removes every bond (a device bluetoothd keeps as Paired while it is not connected) as soon as
# it appears, and logs each removal to /run/btvm/forget-bonds.log.
#
# Why the lab needs it: btvirt's emulated controllers (BlueZ 5.66, and upstream at the time of
# writing) remember the IO capability a host gave in the first Secure Simple Pairing and skip the
# other controller's IO capability exchange in every later pairing. The side that skipped it
# then stores the pairing's key as a bond (a real controller exchanges IO capabilities every
# time, and PeerLink's pairings, without bonding, are never stored), and bluetoothd refuses the
# other side's next pairing because of that one-sided bond. Removing the emulator's bonds keeps
# the lab what real controllers are. Tests about bonds (a stale bond, a desktop's agent) run in
# VM boots of their own without this (Hardware/bluetooth-lab.sh).
import dbus, dbus.mainloop.glib, subprocess, time
from gi.repository import GLib

dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
bus = dbus.SystemBus()
log = open("/run/btvm/forget-bonds.log", "a", buffering=1)


def manager():
    return dbus.Interface(bus.get_object("org.bluez", "/"), "org.freedesktop.DBus.ObjectManager")


# A bond is removed only once its device has had no link for a while (bluetoothd says it is not
# connected, and the kernel has no ACL link to it): removing a device disconnects it, and a link
# being set up or torn down must not be cut.
QUIET = 3.0
quiet_since = {}


def acl_addresses():
    try:
        out = subprocess.run(["hcitool", "con"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {word for line in out.splitlines() for word in line.split() if word.count(":") == 5}


def sweep(*_):
    try:
        objects = manager().GetManagedObjects()
    except dbus.DBusException:
        return True
    linked = acl_addresses()
    now = time.monotonic()
    bonded = set()
    for path, interfaces in objects.items():
        device = interfaces.get("org.bluez.Device1")
        if not device or not device.get("Paired"):
            continue
        if device.get("Connected") or linked is None or str(device["Address"]) in linked:
            quiet_since.pop(path, None)
            continue
        bonded.add(path)
        since = quiet_since.setdefault(path, now)
        if now - since < QUIET:
            continue
        adapter = dbus.Interface(bus.get_object("org.bluez", device["Adapter"]), "org.bluez.Adapter1")
        try:
            adapter.RemoveDevice(path)
            log.write("%.1f removed the emulator's bond %s\n" % (now, path))
        except dbus.DBusException as error:
            log.write("%.1f could not remove %s: %s\n" % (now, path, error))
        quiet_since.pop(path, None)
    for path in list(quiet_since):
        if path not in bonded:
            quiet_since.pop(path)
    return True


GLib.timeout_add(1000, sweep)
print("forget-bonds: running", flush=True)
GLib.MainLoop().run()
