import Foundation
import Logging
import PeerLinkCore

/// What happens to a LAN advertisement: `published` under a DNS-SD instance name, `renamed`
/// on a collision, `daemonUnavailable` while avahi-daemon is away, `failed` for good.
public typealias LANAdvertiserEvent = AdvertisementEvent

/// Publishes the local peer on the LAN as `_<service>._tcp` through avahi-daemon, with a TXT
/// record holding the protocol version, the identity fingerprint, the display name and the app's
/// discovery info. The DNS-SD instance name is the display name (renamed by Avahi on collision).
///
/// The advertisement points at `port`, where the caller listens for PeerLink links; browsers
/// probe that port to tell a live peer from a stale cache entry.
public final class LANAdvertiser: TransportAdvertiser {
    public let peer: PeerID
    public let serviceType: ServiceType
    public let port: UInt16
    public let record: TXTRecord
    private let context: AvahiContext
    private let publisher: AvahiPublisher
    /// The advertisement's events, starting with `published`.
    public let events: AsyncStream<LANAdvertiserEvent>

    /// Connects to avahi-daemon and starts publishing. Throws `unavailable` when the daemon is not running.
    public init(
        identity: Identity, displayName: DisplayName, serviceType: ServiceType,
        info: DiscoveryInfo = try! DiscoveryInfo(), port: UInt16, logger: Logger = Logger(label: "peerlink.lan")
    ) throws(PeerLinkError) {
        var tagged = logger
        tagged[metadataKey: "transport"] = "lan"
        let logger = tagged
        self.peer = PeerID(identity: identity, displayName: displayName)
        self.serviceType = serviceType
        self.port = port
        self.record = TXTRecord(fingerprint: identity.fingerprint, displayName: displayName.value, info: info)
        context = try AvahiContext.connect(logger: logger)
        let (events, continuation) = AsyncStream<LANAdvertiserEvent>.makeStream(bufferingPolicy: .bufferingNewest(64))
        self.events = events
        publisher = AvahiPublisher(
            context: context, name: displayName.value, type: serviceType.dnsSDType, port: port, txt: record.encoded()
        ) { event in
            switch event {
            case .established(let name):
                logger.info("published", metadata: ["instance": "\(name)", "type": "\(serviceType.dnsSDType)", "port": "\(port)"])
                continuation.yield(.published(instanceName: name))
            case .renamed(let from, let to):
                continuation.yield(.renamed(from: from, to: to))
            case .daemonLost:
                continuation.yield(.daemonUnavailable(daemon: "avahi-daemon"))
            case .failed(let message):
                logger.warning("publishing failed: \(message)")
                continuation.yield(.failed(PeerLinkError(.unavailable, message)))
            }
        }
        publisher.start()
    }

    /// `as _chat._tcp, port 4000`.
    public var summary: String { "as \(serviceType.dnsSDType), port \(port)" }

    /// Withdraws the advertisement. Also done when the advertiser is released.
    public func stop() {
        publisher.stop()
    }
}
