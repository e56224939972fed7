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
import dbus, dbus.mainloop.glib, time
from gi.repository import GLib

dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
bus = dbus.SystemBus()
log = open("/run/btvm/forget-bonds.log", "a", buffering=1)


def manager():
    return dbus.Interface(bus.get_object("org.bluez", "/"), "org.freedesktop.DBus.ObjectManager")


def sweep(*_):
    try:
        objects = manager().GetManagedObjects()
    except dbus.DBusException:
        return True
    for path, interfaces in objects.items():
        device = interfaces.get("org.bluez.Device1")
        if not device or not device.get("Paired") or device.get("Connected"):
            continue
        adapter = dbus.Interface(bus.get_object("org.bluez", device["Adapter"]), "org.bluez.Adapter1")
        try:
            adapter.RemoveDevice(path)
            log.write("%.1f removed the emulator's bond %s\n" % (time.monotonic(), path))
        except dbus.DBusException as error:
            log.write("%.1f could not remove %s: %s\n" % (time.monotonic(), path, error))
    return True


bus.add_signal_receiver(
    lambda interface, changed, invalidated: sweep() if interface == "org.bluez.Device1" else None,
    dbus_interface="org.freedesktop.DBus.Properties", signal_name="PropertiesChanged")
bus.add_signal_receiver(sweep, dbus_interface="org.freedesktop.DBus.ObjectManager", signal_name="InterfacesAdded")
GLib.timeout_add(1000, sweep)
print("forget-bonds: running", flush=True)
GLib.MainLoop().run()
