import Logging
import PeerLinkCore
import PeerLinkLAN
import PeerLinkPosix
import PeerLinkSession

/// A peer on the LAN, ready to run: a TCP listener, its DNS-SD advertisement, a browser for
/// the same service, and a ``PeerSession`` fed by that browser.
///
/// ```swift
/// let peer = try LANPeer(configuration: PeerSessionConfiguration(
///     identity: identity, displayName: name, serviceType: service, policy: SessionPolicy(automatic: true)))
/// try await withThrowingTaskGroup { group in
///     group.addTask { await peer.run() }
///     for await event in peer.session.events { … }
/// }
/// ```
///
/// Needs avahi-daemon (the initializer throws `unavailable` without it). The listener takes any
/// free port on every interface unless told otherwise; the advertisement points at it.
///
/// With `advertising: false` the peer is not published: it browses, dials and accepts links, and
/// whoever owns it decides when (and with what discovery info) its listener is published — as
/// ``NearbyServiceAdvertiser`` does for a ``MultipeerSession``.
public final class LANPeer: Sendable {
    public let session: PeerSession
    /// The advertisement of ``listener``; nil when made with `advertising: false`.
    public let advertiser: LANAdvertiser?
    public let browser: LANBrowser
    public let listener: TCPTransportListener
    /// Where the browser's events go (as source `lan`): other browsers, such as a
    /// ``PeerLinkBluetooth/BluetoothBrowser``, feed it too, so the session sees one peer per identity.
    public let feed: DiscoveryFeed
    private let logger: Logger

    /// - Parameters:
    ///   - configuration: the session's configuration; checked here.
    ///   - info: the app's discovery info, published in the TXT record.
    ///   - advertising: whether to publish the peer (false: no advertisement, `info` unused).
    ///   - liveness: how fast the browser notices a vanished peer.
    ///   - listenHost: the numeric address to listen on (nil: every interface).
    ///   - transports: more transports for the session, after TCP (such as a
    ///     ``BluetoothTransport``), so it dials their endpoints too.
    ///   - listeners: more listeners the session accepts on (such as RFCOMM and L2CAP ones);
    ///     ``run()`` closes them at the end, like the TCP one.
    ///   - logger: where the listener, advertiser, browser and session log.
    /// - Throws: a ``PeerLinkCore/PeerLinkError``: `invalidParameter` for a configuration out of
    ///   range, `unavailable` when avahi-daemon is not running (advertising) or no port can be had.
    public init(
        configuration: PeerSessionConfiguration, info: DiscoveryInfo = try! DiscoveryInfo(), advertising: Bool = true,
        liveness: LivenessPolicy = LivenessPolicy(), listenHost: String? = nil,
        transports: [any Transport] = [], listeners: [any TransportListener] = [],
        logger: Logger = Logger(label: "peerlink")
    ) throws(PeerLinkError) {
        try configuration.validate()
        // Resource limits (issue 11): the listener keeps the configured descriptor reserve.
        let listener = try TCPTransportListener(host: listenHost, port: 0, limits: configuration.limits)
        if advertising {
            do {
                advertiser = try LANAdvertiser(
                    identity: configuration.identity, displayName: configuration.displayName,
                    serviceType: configuration.serviceType, info: info, port: listener.port, logger: logger)
            } catch {
                listener.close()
                throw error
            }
        } else {
            advertiser = nil
        }
        self.listener = listener
        self.logger = logger
        browser = LANBrowser(
            serviceType: configuration.serviceType, liveness: liveness, excluding: [configuration.identity.fingerprint],
            logger: logger)
        session = PeerSession(
            configuration: configuration, transports: [TCPTransport()] + transports, listeners: [listener] + listeners,
            logger: logger)
        feed = DiscoveryFeed(session: session)
    }

    /// Runs the session and feeds it what the browser finds, until the task is cancelled or the
    /// session ends (``PeerSession/disconnect()``); then withdraws the advertisement and closes
    /// the listener.
    public func run() async {
        enum Finished { case session, browser }
        await withTaskGroup(of: Finished.self) { group in
            group.addTask {
                await self.session.run()
                return .session
            }
            group.addTask {
                do throws(PeerLinkError) {
                    for await event in try self.browser.events() {
                        self.feed.apply(event, from: "lan")
                    }
                } catch {
                    self.logger.info(
                        "browsing the LAN failed; peers can still dial this one",
                        metadata: ["transport": "lan", "reason": "\(error.message)"])
                }
                return .browser
            }
            while let finished = await group.next() {
                if finished == .session { group.cancelAll() }
            }
        }
        advertiser?.stop()
        for listener in session.listeners { listener.close() }
    }
}
