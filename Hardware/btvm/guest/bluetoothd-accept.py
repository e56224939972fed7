#!/usr/bin/python3
# btvm guest/bluetoothd-accept.py: guest-side, for a bluetoothd stuck in accept(2).
#
# bluetoothd's main loop calls a blocking accept(2) on a listening L2CAP or RFCOMM socket once
# the socket polled readable. When the connection that made it readable is gone by then (its
# peer closed it before bluetoothd got to it), the call waits for the next connection, and the
# daemon answers nothing meanwhile: every D-Bus call to it (PeerLink's included) times out. Seen
# in CI runs of BluetoothDiscoveryLabTests, right after an `sdptool browse` from the other
# controller (see ../README.md, "Kernel faults"). A stock bluetoothd's own behaviour, and one
# connection to that listener ends it: the accept returns it, and the loop goes on.
#
#   bluetoothd-accept.py --describe   prints whether bluetoothd waits in accept(2) and on which
#                                     listener (its address, PSM or channel); exit 0 if it does
#   bluetoothd-accept.py --free       when it waits there: connects to that listener from the
#                                     other controller, holds the connection until the accept
#                                     returned (at most 10 s), says how it went; exit 0 if freed
#   bluetoothd-accept.py --watch      beside the tests: every half second, a bluetoothd found
#                                     waiting inside the kernel's L2CAP or RFCOMM accept on the
#                                     same descriptor for a second is freed as above; each time
#                                     goes to /run/btvm/bluetoothd-accept.log
#
# The listener is found by taking a copy of bluetoothd's descriptor (pidfd_getfd(2), as root)
# and asking it its own address; the copy is closed, the listener is left as it was.
import ctypes, os, socket, subprocess, sys, time

PIDFILE = "/run/btvm/bluetoothd.pid"
LOG = "/run/btvm/bluetoothd-accept.log"
ACCEPT_CALLS = {43, 288}  # accept, accept4 (x86-64)
SYS_PIDFD_GETFD = 438
libc = ctypes.CDLL(None, use_errno=True)


def uptime():
    with open("/proc/uptime") as f:
        return f.read().split()[0]


def bluetoothd_pid():
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def waiting_in_accept(pid):
    """The descriptor bluetoothd waits on in accept(2), with the kernel function it waits in, or None."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) < 2 or not fields[0].isdigit() or int(fields[0]) not in ACCEPT_CALLS:
        return None
    try:
        with open(f"/proc/{pid}/stack") as f:
            stack = f.read()
    except OSError:
        stack = ""
    where = next((name for name in ("l2cap_sock_accept", "rfcomm_sock_accept") if name in stack), "accept")
    return int(fields[1], 16), where


def still_waits(pid, fd):
    stuck = waiting_in_accept(pid)
    return stuck is not None and stuck[0] == fd


def listener(pid, fd):
    """(protocol name, address, PSM or channel) of bluetoothd's descriptor fd, or a reason it is not known."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as error:
        return f"pidfd_open failed: {error.strerror}"
    try:
        copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            return f"pidfd_getfd failed: {os.strerror(ctypes.get_errno())}"
        try:
            sock = socket.socket(fileno=copy)
        except OSError as error:
            os.close(copy)
            return f"descriptor {fd} is not a socket this can read ({error.strerror})"
        try:
            address, port = sock.getsockname()
            name = {socket.BTPROTO_L2CAP: "L2CAP", socket.BTPROTO_RFCOMM: "RFCOMM"}.get(sock.proto)
            if sock.family != socket.AF_BLUETOOTH or name is None:
                return f"descriptor {fd} is not an L2CAP or RFCOMM socket"
            return name, address, port
        except (OSError, ValueError, TypeError) as error:
            return f"descriptor {fd}: getsockname failed ({error})"
        finally:
            sock.close()
    finally:
        os.close(pidfd)


def controllers():
    found = {}
    for name in sorted(os.listdir("/run/btvm")):
        if name.startswith("addr_hci"):
            with open(f"/run/btvm/{name}") as f:
                address = f.read().strip()
            if address:
                found[name[len("addr_"):]] = address
    return found


def page_scan(hci, on=None):
    """Whether controller hci takes connections (page scan); with on, turns it on or off first."""
    try:
        if on is not None:
            subprocess.run(["hciconfig", hci, "pscan" if on else "noscan"], capture_output=True, timeout=10)
        shown = subprocess.run(["hciconfig", hci], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "PSCAN" in shown.split()


def describe(pid):
    stuck = waiting_in_accept(pid)
    if stuck is None:
        return None, "bluetoothd is not in accept(2)"
    fd, where = stuck
    found = listener(pid, fd)
    if isinstance(found, str):
        return None, f"bluetoothd waits in accept(2) ({where}) on descriptor {fd}; {found}"
    protocol, address, port = found
    what = "PSM" if protocol == "L2CAP" else "channel"
    return (fd, found), f"bluetoothd waits in accept(2) ({where}) on descriptor {fd}: {protocol} {what} {port} of {address}"


def free(pid):
    """Connects to the listener bluetoothd waits on, from a controller other than the one it is bound to."""
    known, text = describe(pid)
    if known is None:
        return False, text
    fd, (protocol, address, port) = known
    mine = controllers()
    # the listener is bound to one controller or to any: connect to it from another one
    target = address if address in mine.values() else mine.get("hci0")
    source = next((a for a in mine.values() if a != target), None)
    if target is None or source is None:
        return False, f"{text}; no second controller to connect from"
    # A controller whose adapter is not discoverable takes no connection from an unknown device
    # (bluetoothd, stuck, cannot change that): page scan goes on for this, through the kernel,
    # and off again after. (Once, the socket of a connection refused so, closed, set off the
    # lab kernel's list corruption in hci_chan_del: see ../README.md, "Kernel faults".)
    hci = next(name for name, a in mine.items() if a == target)
    scanned = page_scan(hci)
    if not scanned and not page_scan(hci, on=True):
        return False, f"{text}; {hci} could not be made to take connections (hciconfig {hci} pscan)"
    try:
        return connect_and_hold(pid, fd, text, protocol, source, target, port)
    finally:
        if not scanned:
            page_scan(hci, on=False)


def connect_and_hold(pid, fd, text, protocol, source, target, port):
    kind = socket.BTPROTO_L2CAP if protocol == "L2CAP" else socket.BTPROTO_RFCOMM
    style = socket.SOCK_SEQPACKET if protocol == "L2CAP" else socket.SOCK_STREAM
    sock = socket.socket(socket.AF_BLUETOOTH, style, kind)
    try:
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect((target, port))
    except OSError as error:
        sock.close()
        return False, f"{text}; a connection from {source} to it failed ({error.strerror or error})"
    try:
        # hold it until bluetoothd took it: closed before that, it would leave the same wait
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and still_waits(pid, fd):
            time.sleep(0.1)
        freed = not still_waits(pid, fd)
        time.sleep(1)
    finally:
        sock.close()
    if freed:
        return True, f"{text}; a connection from {source} freed it"
    return False, f"{text}; a connection from {source} was made and bluetoothd still waits"


def watch():
    log = open(LOG, "a", buffering=1)
    seen = None
    while True:
        time.sleep(0.5)
        pid = bluetoothd_pid()
        stuck = waiting_in_accept(pid) if pid else None
        # inside the kernel's accept, not merely at the call (a traced bluetoothd stops there)
        if stuck is None or stuck[1] == "accept":
            seen = None
            continue
        if seen != (pid, stuck):
            seen, first = (pid, stuck), time.monotonic()
            continue
        if time.monotonic() - first < 1:
            continue
        try:
            freed, text = free(pid)
        except Exception as error:  # the watcher goes on: the next sighting is tried again
            freed, text = False, f"freeing bluetoothd failed: {error!r}"
        log.write(f"at {uptime()} s of uptime: {text}\n")
        seen = None
        if not freed:
            time.sleep(5)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--watch":
        watch()
    pid = bluetoothd_pid()
    if pid is None:
        print("bluetoothd is not running")
        return 1
    if mode == "--describe":
        known, text = describe(pid)
        print(text)
        return 0 if known else 1
    if mode == "--free":
        freed, text = free(pid)
        print(text)
        return 0 if freed else 1
    print("usage: bluetoothd-accept.py --describe | --free | --watch", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
