import PeerLinkCore
import PeerLinkPosix

/// bluetoothd's D-Bus API (BlueZ's `doc/org.bluez.*.rst`): names, the connection to it, and
/// its errors turned into messages that say what to do.
enum BlueZ {
    static let service = "org.bluez"
    static let adapterInterface = "org.bluez.Adapter1"
    static let deviceInterface = "org.bluez.Device1"
    static let profileManagerInterface = "org.bluez.ProfileManager1"
    static let profileInterface = "org.bluez.Profile1"
    static let startAdvice = "start it with 'sudo systemctl start bluetooth' (without systemd: 'sudo bluetoothd &')"

    /// Connects to the system bus (or the bus at `address`) and checks that bluetoothd is on it.
    ///
    /// It blocks until the bus answers, like every call on the connection (up to 25 s when
    /// bluetoothd hangs): async code calls it, and the calls on the connection, through
    /// ``PeerLinkPosix/runBlocking(_:_:)`` so that no cooperative thread waits for a daemon.
    static func connect(address: String = DBusConnection.systemBusAddress) throws(PeerLinkError) -> DBusConnection {
        let connection = try DBusConnection.open(address: address)
        let reply: [DBusValue]
        do {
            reply = try connection.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                method: "NameHasOwner", [.string(service)], timeout: .seconds(5))
        } catch {
            connection.close()
            throw map(error, doing: "asking the system D-Bus for bluetoothd")
        }
        guard reply.first?.bool == true else {
            connection.close()
            throw PeerLinkError(.unavailable, "bluetoothd is not running (no \(service) on the system D-Bus): \(startAdvice)")
        }
        return connection
    }

    /// Closes `connection` from async code: on a thread of its own, since ``DBusConnection/close()``
    /// waits for the connection's dispatch thread to stop.
    static func close(_ connection: DBusConnection) async {
        await runBlocking("peerlink-dbus-close") { connection.close() }
    }

    /// The adapter's object path: `/org/bluez/hciN`.
    static func adapterPath(_ name: String) -> String { "/org/bluez/" + name }

    /// What a bluetoothd error means for the user, `doing` saying what was attempted.
    static func map(_ error: DBusCallError, doing: String) -> PeerLinkError {
        let detail = error.message.isEmpty ? error.name : error.message
        if error.message.localizedCaseInsensitiveContains("already registered") || error.name == "org.bluez.Error.AlreadyExists" {
            return PeerLinkError(.unavailable, "\(doing): bluetoothd already has it (\(detail)): another PeerLink process with this identity advertises this service type on this machine; stop it, or use another --identity or --service")
        }
        switch error.name {
        case DBusCallError.serviceUnknown, DBusCallError.nameHasNoOwner:
            return PeerLinkError(.unavailable, "bluetoothd is not running (\(doing) failed: \(detail)): \(startAdvice)")
        case DBusCallError.accessDenied, "org.bluez.Error.NotPermitted", "org.bluez.Error.NotAuthorized":
            return PeerLinkError(.unavailable, "bluetoothd refused \(doing) (\(detail)): run as a member of the 'bluetooth' group ('sudo usermod -aG bluetooth $USER', then log in again) or as root; the D-Bus policy is /etc/dbus-1/system.d/bluetooth.conf")
        case DBusCallError.noReply, DBusCallError.timeout:
            return PeerLinkError(.timedOut, "bluetoothd did not answer \(doing) in time (\(detail)): it is busy or hangs; if 'bluetoothctl show' does not answer either, restart it with 'sudo systemctl restart bluetooth'")
        case DBusCallError.unknownObject, "org.freedesktop.DBus.Error.UnknownInterface", DBusCallError.unknownMethod:
            return PeerLinkError(.unavailable, "bluetoothd has no such adapter or interface (\(doing): \(detail)): list adapters with 'peerlink radios'")
        case "org.bluez.Error.NotReady":
            return PeerLinkError(.unavailable, "the Bluetooth adapter is not ready (\(doing): \(detail)): power it on with 'bluetoothctl power on' and check 'rfkill list'")
        case "org.bluez.Error.Blocked", "org.bluez.Error.Busy":
            return PeerLinkError(.unavailable, "the Bluetooth adapter is blocked or busy (\(doing): \(detail)): check 'rfkill list' ('rfkill unblock bluetooth')")
        case "org.bluez.Error.InProgress":
            return PeerLinkError(.unavailable, "\(doing): another operation is in progress (\(detail)); try again in a moment")
        case "org.bluez.Error.InvalidArguments":
            return PeerLinkError(.invalidParameter, "bluetoothd rejected the arguments of \(doing): \(detail)")
        case DBusCallError.disconnected:
            return PeerLinkError(.unavailable, "the system D-Bus connection closed (\(doing)): check the D-Bus daemon runs")
        default:
            return PeerLinkError(.unknown, "bluetoothd: \(doing) failed: \(error.name): \(detail)")
        }
    }
}
