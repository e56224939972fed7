import Logging
import PeerLinkCore

/// Bluetooth Classic as a transport module: RFCOMM and L2CAP links on one adapter (a listener of
/// each kind, a dialer for `bt://` endpoints), an SDP record registered with bluetoothd to
/// advertise (``BluetoothAdvertiser``), and scans with SDP searches to browse
/// (``BluetoothBrowser``).
///
/// Its links need a kernel with Bluetooth and an adapter that is up (``openLinks(limits:)`` throws
/// otherwise, saying what to do); advertising needs bluetoothd; browsing uses bluetoothd's
/// discovery, else an HCI inquiry. Without bluetoothd, explicit endpoints
/// (`bt://ADDR/l2cap/PSM`, `bt://ADDR/rfcomm/CHANNEL`) still connect.
///
/// Where bluetoothd is waited for: ``openLinks(limits:)`` and ``advertise(_:at:)`` ask it on the
/// caller's thread (a ``PeerNode`` made with `PeerNode.open` calls them on a thread of its own);
/// the dialer and the browser, which are async, make their D-Bus calls, SDP searches and
/// inquiries on threads of their own.
public struct BluetoothTransportModule: TransportModule {
    public var name: String { "bluetooth" }
    public var label: String { "Bluetooth" }
    /// L2CAP first: packets with a negotiated MTU.
    public var kinds: [TransportKind] { [.l2cap, .rfcomm] }
    public var endpointSchemes: [EndpointScheme] { [.bluetooth] }
    /// A Bluetooth page alone may take 5.12 s, and SDP and pairing come on top.
    public var dialTimeout: Duration? { .seconds(20) }

    /// The adapter (`hciN`); nil: the first one that is up.
    public var adapter: String?
    /// The RFCOMM channel to listen on; nil: a free one.
    public var rfcommChannel: RFCOMMChannel?
    /// The L2CAP PSM to listen on; nil: a free dynamic one.
    public var l2capPSM: L2CAPPSM?
    /// L2CAP: the largest packet this side accepts (nil: the kernel's default, 672).
    public var incomingMTU: UInt16?
    /// How long one browsing round (an inquiry or a bluetoothd discovery, then SDP searches) takes.
    public var roundDuration: Duration
    public var logger: Logger

    public init(
        adapter: String? = nil, rfcommChannel: RFCOMMChannel? = nil, l2capPSM: L2CAPPSM? = nil, incomingMTU: UInt16? = nil,
        roundDuration: Duration = .seconds(5), logger: Logger = Logger(label: "peerlink.bluetooth")
    ) {
        self.adapter = adapter
        self.rfcommChannel = rfcommChannel
        self.l2capPSM = l2capPSM
        self.incomingMTU = incomingMTU
        self.roundDuration = roundDuration
        self.logger = logger
    }

    /// Whether `name` names an adapter the way this module takes it: `hciN`.
    public static func isAdapterName(_ name: String) -> Bool {
        guard name.hasPrefix("hci"), let index = Int(name.dropFirst(3)), index >= 0 else { return false }
        return true
    }

    /// The adapter to use: the one named, else the first that is up.
    public func chosenAdapter() throws(PeerLinkError) -> BluetoothAdapter {
        let adapters = try BluetoothAdapter.all()
        if let adapter {
            guard let found = adapters.first(where: { $0.name == adapter }) else {
                let names = adapters.map(\.name).joined(separator: ", ")
                throw PeerLinkError(
                    .unavailable,
                    "there is no Bluetooth adapter \(adapter) (this machine has \(names.isEmpty ? "none" : names)): see 'peerlink radios'")
            }
            guard found.isUp else {
                throw PeerLinkError(
                    .unavailable,
                    "adapter \(found.name) is down: switch it on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth' if it is blocked)")
            }
            return found
        }
        guard let first = adapters.first(where: \.isUp) else {
            throw PeerLinkError(
                .unavailable,
                adapters.isEmpty
                    ? "this machine has no Bluetooth adapter: plug one in, or check 'rfkill list'"
                    : "no Bluetooth adapter is up: switch one on with 'bluetoothctl power on' (or 'rfkill unblock bluetooth')")
        }
        return first
    }

    /// An RFCOMM and an L2CAP listener on the chosen adapter, and a dialer leaving from it.
    public func openLinks(limits: ResourceLimits) throws(PeerLinkError) -> TransportLinks {
        let chosen = try chosenAdapter()
        guard let address = BluetoothAddress(chosen.address) else {
            throw PeerLinkError(.unknown, "adapter \(chosen.name) reports an address PeerLink cannot read: \(chosen.address)")
        }
        let rfcomm = try BluetoothTransportListener(
            .rfcomm, adapter: address, port: UInt16(rfcommChannel?.value ?? 0), incomingMTU: incomingMTU)
        let l2cap: BluetoothTransportListener
        do {
            l2cap = try BluetoothTransportListener(.l2cap, adapter: address, port: l2capPSM?.value ?? 0, incomingMTU: incomingMTU)
        } catch {
            rfcomm.close()
            throw error
        }
        return TransportLinks(
            dialer: BluetoothTransport(adapter: address, incomingMTU: incomingMTU, logger: logger), listeners: [rfcomm, l2cap],
            place: chosen.name)
    }

    /// Registers the SDP record pointing at the RFCOMM channel and L2CAP PSM among `endpoints`,
    /// on their adapter.
    public func advertise(_ advertisement: Advertisement, at endpoints: [Endpoint]) throws(PeerLinkError) -> any TransportAdvertiser {
        let local = endpoints.compactMap(\.bluetooth)
        var channel: RFCOMMChannel?
        var psm: L2CAPPSM?
        for endpoint in local {
            switch endpoint.port {
            case .rfcomm(let value): channel = channel ?? value
            case .l2cap(let value): psm = psm ?? value
            }
        }
        // The adapter the listeners are bound to, by address; else the one configured.
        let bound = local.first.map(\.address)
        let adapterName = bound.flatMap { address in
            (try? BluetoothAdapter.all())?.first { BluetoothAddress($0.address) == address }?.name
        } ?? adapter
        return try BluetoothAdvertiser(
            identity: advertisement.identity, displayName: advertisement.displayName, serviceType: advertisement.serviceType,
            info: advertisement.info, channel: channel, psm: psm, adapter: adapterName, logger: logger)
    }

    public func browser(_ request: BrowseRequest) -> any TransportBrowser {
        BluetoothBrowser(
            serviceType: request.serviceType, adapter: adapter, roundDuration: request.scanWindow ?? roundDuration,
            excluding: request.excluding, logger: logger)
    }
}
