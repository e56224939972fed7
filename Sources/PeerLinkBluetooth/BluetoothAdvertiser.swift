import Foundation
import Logging
import PeerLinkCore

/// Publishes the local peer over Bluetooth: a PeerLink SDP record (``PeerLinkServiceRecord``)
/// registered with bluetoothd through `org.bluez.ProfileManager1.RegisterProfile`.
///
/// bluetoothd registers each profile UUID once per machine; the profile UUID PeerLink passes is
/// derived from the service class and the identity, so several peers (different identities) can
/// advertise the same service type on one machine, and the same identity twice is refused.
///
/// The record points at the RFCOMM channel and L2CAP PSM where the caller listens; bluetoothd
/// only serves the record (no `Channel` or `PSM` option is passed, so it never listens there
/// itself). bluetoothd publishes a profile on every adapter; the chosen adapter is powered on
/// and held discoverable while the record is up, so inquiries find it
/// (``BluetoothVisibilityHold``: restored afterwards). ``stop()`` unregisters the record;
/// bluetoothd also drops it when this process's D-Bus connection closes, even after `kill -9`.
public final class BluetoothAdvertiser: TransportAdvertiser, @unchecked Sendable {
    public let peer: PeerID
    public let record: PeerLinkServiceRecord
    /// The adapter made powered and discoverable (`hciN`) and its address.
    public let adapter: String
    public let adapterAddress: BluetoothAddress
    private let connection: DBusConnection
    private let profilePath: String
    private let visibility: BluetoothVisibilityHold?
    private let logger: Logger
    private let lock = NSLock()
    private var stopped = false

    /// Registers the record. Throws `unavailable` when D-Bus or bluetoothd is not running, with
    /// what to do; `invalidParameter` when there is neither a channel nor a PSM.
    ///
    /// The D-Bus calls run on the caller's thread and block until bluetoothd answers (up to
    /// 25 s each when it hangs); ``stop()`` too. From async code, call them through
    /// ``PeerLinkPosix/runBlocking(_:_:)`` (a ``PeerNode`` made with `PeerNode.open` does).
    public init(
        identity: Identity, displayName: DisplayName, serviceType: ServiceType, info: DiscoveryInfo = try! DiscoveryInfo(),
        channel: RFCOMMChannel?, psm: L2CAPPSM?, adapter: String? = nil, logger: Logger = Logger(label: "peerlink.bluetooth")
    ) throws(PeerLinkError) {
        guard channel != nil || psm != nil else {
            throw PeerLinkError(.invalidParameter, "a Bluetooth advertisement needs an RFCOMM channel or an L2CAP PSM to point at")
        }
        var tagged = logger
        tagged[metadataKey: "transport"] = "bluetooth"
        self.logger = tagged
        peer = PeerID(identity: identity, displayName: displayName)
        record = PeerLinkServiceRecord(
            serviceType: serviceType, record: TXTRecord(fingerprint: identity.fingerprint, displayName: displayName.value, info: info),
            channel: channel, psm: psm)
        connection = try BlueZ.connect()
        let chosen: BluetoothDaemonAdapter
        do {
            chosen = try BluetoothDaemon.chooseAdapter(adapter, on: connection)
            try BluetoothDaemon.powerOn(chosen, on: connection)
            visibility = try BluetoothVisibilityHold.acquire(adapter: chosen.name)
        } catch {
            connection.close()
            throw error
        }
        self.adapter = chosen.name
        adapterAddress = BluetoothAddress(chosen.address) ?? .any
        profilePath = "/org/peerlink/profile/\(serviceType.value.replacingOccurrences(of: "-", with: "_"))_\(UInt32.random(in: 0...UInt32.max))"
        let log = self.logger
        do {
            try connection.export(path: profilePath) { call in
                // bluetoothd listens on nothing for this profile, so NewConnection does not come;
                // a descriptor handed over anyway is closed.
                if call.member == "NewConnection" {
                    for case .unixFD(let fd) in call.arguments.map(\.unwrapped) { _ = Foundation.close(fd) }
                }
                log.debug("profile call", metadata: ["member": "\(call.member)"])
                return .success([])
            }
            let options: [String: DBusValue] = [
                "ServiceRecord": .string(record.bluezXML),
                "Name": .string("PeerLink \(serviceType.value)"),
                "Role": .string("server"),
                "RequireAuthentication": .bool(false),
                "RequireAuthorization": .bool(false),
                "AutoConnect": .bool(false),
            ]
            // bluetoothd keys profiles by this UUID and takes each one once per machine; the
            // record itself (ServiceRecord) carries the service class. A UUID per service type
            // and identity lets several PeerLink peers share one machine's bluetoothd.
            let profileUUID = BluetoothUUID(version5Namespace: serviceType.bluetoothServiceClass, name: identity.fingerprint.value)
            _ = try connection.call(
                destination: BlueZ.service, path: "/org/bluez", interface: BlueZ.profileManagerInterface, method: "RegisterProfile",
                [.objectPath(profilePath), .string(profileUUID.description), .properties(options)])
        } catch {
            visibility?.release()
            connection.close()
            throw BlueZ.map(error, doing: "registering the PeerLink SDP record")
        }
        tagged.info("registered SDP record", metadata: [
            "uuid": "\(serviceType.bluetoothServiceClass)", "channel": "\(channel.map(\.description) ?? "-")",
            "psm": "\(psm.map(\.description) ?? "-")", "adapter": "\(chosen.name)",
        ])
    }

    /// `over Bluetooth on hci0 00:AA:01:00:00:00: SDP service class …, RFCOMM channel 3, L2CAP PSM 0x1001`.
    public var summary: String {
        "over Bluetooth on \(adapter) \(adapterAddress): SDP service class \(record.serviceType.bluetoothServiceClass), "
            + "RFCOMM channel \(record.channel.map(\.description) ?? "-"), L2CAP PSM \(record.psm.map(\.description) ?? "-")"
    }

    /// The record is up once the advertiser exists (bluetoothd answered the registration): the
    /// stream has no events and is finished.
    public let events: AsyncStream<AdvertisementEvent> = AsyncStream { $0.finish() }

    /// Withdraws the record. Idempotent; also done when the advertiser is released. A call made
    /// while another withdraws the record returns once it is withdrawn, so a new advertisement
    /// of the same identity and service type can follow any call (bluetoothd takes each once).
    public func stop() {
        lock.withLock {
            guard !stopped else { return }
            stopped = true
            do {
                _ = try connection.call(
                    destination: BlueZ.service, path: "/org/bluez", interface: BlueZ.profileManagerInterface, method: "UnregisterProfile",
                    [.objectPath(profilePath)], timeout: .seconds(5))
            } catch {
                logger.debug("UnregisterProfile failed (the record goes with the connection)", metadata: ["error": "\(error)"])
            }
            connection.unexport(path: profilePath)
            connection.close()
            visibility?.release()
        }
    }

    deinit { stop() }
}
