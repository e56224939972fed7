import Foundation
import Logging
import PeerLinkBluetooth
import PeerLinkCore
import PeerLinkLAN

/// The transport modules PeerLink ships, in the order a node starts them. The one place that
/// names them: a node, `peerlink` and ``TransportChoice`` find transports here, and an app with a
/// transport of its own passes it with ``TransportChoice/modules(_:)`` instead.
public enum StandardTransports {
    /// The LAN (``PeerLinkLAN/LANTransportModule``), then Bluetooth
    /// (``PeerLinkBluetooth/BluetoothTransportModule``), each with its default settings.
    public static func modules(logger: Logger = Logger(label: "peerlink")) -> [any TransportModule] {
        [LANTransportModule(logger: logger), BluetoothTransportModule(logger: logger)]
    }

    /// Their names: `lan`, `bluetooth`.
    public static var names: [String] { modules().map(\.name) }
}

/// Which transports a node runs: the LAN, Bluetooth, every standard one (`auto`, the usual
/// choice), or modules the app gives.
///
/// A module that cannot run here (avahi-daemon not running, no Bluetooth in the kernel) is
/// reported as a ``TransportNotice`` and the node goes on with the others; the node fails only
/// when none can run.
///
/// ```swift
/// .auto                                                     // LAN and Bluetooth
/// try TransportChoice(parsing: "bluetooth")                 // what --transport takes
/// .auto.configuring(BluetoothTransportModule(adapter: "hci1"))
/// .modules([LANTransportModule(), MyTransportModule()])     // a transport of the app's own
/// ```
public struct TransportChoice: Sendable, CustomStringConvertible {
    /// The standard modules by name (nil: every one), or the app's modules.
    private let names: [String]?
    private let explicit: [any TransportModule]?
    /// Modules to use in place of the standard module of the same name.
    private let replacements: [any TransportModule]

    private init(names: [String]?, explicit: [any TransportModule]?, replacements: [any TransportModule] = []) {
        self.names = names
        self.explicit = explicit
        self.replacements = replacements
    }

    /// The LAN only: TCP links, DNS-SD through avahi-daemon.
    public static let lan = TransportChoice(names: ["lan"], explicit: nil)
    /// Bluetooth Classic only: RFCOMM and L2CAP links, SDP through bluetoothd.
    public static let bluetooth = TransportChoice(names: ["bluetooth"], explicit: nil)
    /// Every standard transport (``StandardTransports``): the LAN and Bluetooth.
    public static let auto = TransportChoice(names: nil, explicit: nil)

    /// Exactly these modules, in this order.
    public static func modules(_ modules: [any TransportModule]) -> TransportChoice {
        TransportChoice(names: nil, explicit: modules)
    }

    /// Reads `auto`, a standard transport's name (`lan`, `bluetooth`), or several names with
    /// commas (`lan,bluetooth`).
    ///
    /// - Throws: `invalidParameter` naming what is not a transport, and the accepted names.
    public init(parsing text: String) throws(PeerLinkError) {
        let words = text.lowercased().split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        let known = StandardTransports.names
        let accepted = (known + ["auto"]).joined(separator: ", ")
        guard !words.isEmpty, !words.contains("") else {
            throw PeerLinkError(.invalidParameter, "no transport named: use \(accepted) (or several, comma-separated)")
        }
        if words == ["auto"] {
            self = .auto
            return
        }
        for word in words where !known.contains(word) {
            throw PeerLinkError(.invalidParameter, "'\(word)' is not a transport: use \(accepted) (or several, comma-separated)")
        }
        var seen: Set<String> = []
        self.init(names: words.filter { seen.insert($0).inserted }, explicit: nil)
    }

    /// The same choice with `module` in place of the module of the same name (its settings: an
    /// adapter, a port, a logger). Ignored when the choice does not include that module.
    public func configuring(_ module: any TransportModule) -> TransportChoice {
        TransportChoice(names: names, explicit: explicit, replacements: replacements.filter { $0.name != module.name } + [module])
    }

    /// Whether every standard transport is chosen (`auto`).
    public var isAutomatic: Bool { names == nil && explicit == nil }

    /// The modules chosen, in the order a node starts them; standard ones made with `logger`
    /// unless configured.
    public func modules(logger: Logger = Logger(label: "peerlink")) -> [any TransportModule] {
        let chosen: [any TransportModule]
        if let explicit {
            chosen = explicit
        } else {
            let standard = StandardTransports.modules(logger: logger)
            chosen = names.map { names in names.compactMap { name in standard.first { $0.name == name } } } ?? standard
        }
        return chosen.map { module in replacements.first { $0.name == module.name } ?? module }
    }

    /// `auto`, `lan`, `lan,bluetooth`, or the modules' names.
    public var description: String {
        if let explicit { return explicit.map(\.name).joined(separator: ",") }
        return names?.joined(separator: ",") ?? "auto"
    }
}
