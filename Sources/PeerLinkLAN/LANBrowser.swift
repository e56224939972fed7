import Foundation
import Logging
import PeerLinkCore
import PeerLinkPosix

/// Finds PeerLink peers on the LAN: browses `_<service>._tcp` through avahi-daemon, reads their
/// TXT records, merges what it sees by identity, and checks each peer is really there.
///
/// A peer is reported `found` once a TCP connection to one of its endpoints succeeds, and `lost`
/// when it withdraws or stops accepting connections (see ``LivenessPolicy``: within 10 s by
/// default, where a DNS-SD cache alone keeps a vanished peer for 20 s and more). Records that are
/// not PeerLink's (missing keys, bad UTF-8, oversized strings) are skipped with a debug log.
public final class LANBrowser: TransportBrowser {
    public let serviceType: ServiceType
    public let liveness: LivenessPolicy
    private let excluding: Set<Fingerprint>
    private let logger: Logger

    /// - Parameters:
    ///   - excluding: identities never to report (typically the local peer's own).
    public init(
        serviceType: ServiceType, liveness: LivenessPolicy = LivenessPolicy(),
        excluding: Set<Fingerprint> = [], logger: Logger = Logger(label: "peerlink.lan")
    ) {
        self.serviceType = serviceType
        self.liveness = liveness
        self.excluding = excluding
        var logger = logger
        logger[metadataKey: "transport"] = "lan"
        self.logger = logger
    }

    private enum Input: Sendable {
        case avahi(BrowserEvent)
        case probed(DiscoveryTable.Probe, reachable: Bool)
        case tick
    }

    /// Starts browsing. Throws `unavailable` when avahi-daemon is not running. Browsing stops
    /// when the sequence's consumer stops iterating (or its task is cancelled).
    ///
    /// Every call into avahi-client waits for avahi-daemon's answer over D-Bus (milliseconds;
    /// up to libdbus's 25 s timeout when the daemon hangs), and so does taking its poll lock while
    /// its thread waits: starting and stopping the browse run on a thread of their own, never on
    /// the caller's (a cooperative thread, or an event loop's). Cancelling the calling task
    /// ends the wait at once (`cancelled`); a browse that starts after that is stopped again.
    public func events() async throws(PeerLinkError) -> AsyncStream<DiscoveryEvent> {
        let (inputs, input) = AsyncStream<Input>.makeStream()
        let type = serviceType.dnsSDType
        let logger = logger
        // What the browse finds before the driver below runs waits in `inputs`.
        let (context, browser): (AvahiContext, AvahiBrowser)
        do {
            (context, browser) = try await runBlockingAbandonable(
                "peerlink-lan-browse", limit: Self.startLimit,
                discard: { started in Self.end(started.0, started.1) }
            ) { _ in
                let context = try AvahiContext.connect(logger: logger)
                let browser = AvahiBrowser(context: context, type: type) { input.yield(.avahi($0)) }
                browser.start()
                return (context, browser)
            }
        } catch let error as PeerLinkError {
            throw error
        } catch is CancellationError {
            throw PeerLinkError(.cancelled, "browsing \(type) was cancelled before avahi-daemon answered")
        } catch {
            throw PeerLinkError(
                .unavailable,
                "avahi-daemon did not answer within \(Self.startLimit.components.seconds) s. Restart it with 'sudo systemctl restart avahi-daemon'")
        }
        let (events, output) = AsyncStream<DiscoveryEvent>.makeStream()
        let policy = liveness
        let excluding = excluding
        let driver = Task {
            // Discarding: each probe's task is gone once it ended. (A plain task group keeps every
            // finished child until `next()` takes it: one per probe, for as long as the browse
            // runs — a long-running chat grew by a kilobyte for each.)
            await withDiscardingTaskGroup { group in
                group.addTask {
                    // Probes fall due on a clock; a tick wakes the loop to start them.
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(100))
                        input.yield(.tick)
                    }
                }
                var table = DiscoveryTable(policy: policy)
                let start = ContinuousClock.now
                for await next in inputs {
                    let now = start.duration(to: .now)
                    var changes: [DiscoveryEvent] = []
                    switch next {
                    case .avahi(.resolved(let source, let name, _, let address, let port, let txt)):
                        let record: TXTRecord
                        do {
                            record = try TXTRecord(decoding: txt)
                        } catch {
                            logger.debug("ignoring a service that is not a PeerLink peer", metadata: ["instance": "\(PeerText.sanitized(name, limit: 256))", "reason": "\(error)"])
                            changes = table.removed(source: source)
                            break
                        }
                        if excluding.contains(record.fingerprint) { break }
                        let sighting = DiscoveryTable.Sighting(source: source, record: record, endpoints: [.tcp(host: address, port: port)])
                        changes = table.sighted(sighting, at: now)
                    case .avahi(.removed(let source)):
                        changes = table.removed(source: source)
                    case .avahi(.allForNow):
                        break
                    case .avahi(.failed(let message)):
                        logger.warning("\(message)")
                    case .probed(let probe, let reachable):
                        changes = table.probeFinished(probe, reachable: reachable, at: now)
                    case .tick:
                        break
                    }
                    for change in changes {
                        switch change {
                        case .found(let peer): logger.debug("found", metadata: ["peer.id": "\(peer.id.fingerprint)"])
                        case .lost(let peer): logger.debug("lost", metadata: ["peer.id": "\(peer.fingerprint)"])
                        case .updated: break
                        }
                        output.yield(change)
                    }
                    for probe in table.dueProbes(at: now) {
                        group.addTask {
                            let reachable = await Self.probe(probe.endpoints, timeout: probe.timeout)
                            input.yield(.probed(probe, reachable: reachable))
                        }
                    }
                }
                group.cancelAll()
            }
        }
        output.onTermination = { _ in
            driver.cancel()
            input.finish()
            Thread.detachNewThread {
                Sys.nameCurrentThread("peerlink-lan-stop")
                Self.end(context, browser)
            }
        }
        return events
    }

    /// Ends a browse, on the calling thread (never a cooperative one): freeing the browser and
    /// its resolvers asks the daemon too; the context (its client and poll thread), kept as long
    /// as the browse, goes after them.
    private static func end(_ context: AvahiContext, _ browser: AvahiBrowser) {
        browser.stop()
        withExtendedLifetime(context) {}
    }

    /// The longest a browse waits to start: two calls to the daemon, each of which libdbus gives
    /// 25 s (the first one failing says so sooner: ``AvahiContext``).
    static let startLimit: Duration = .seconds(60)

    /// True when any endpoint accepts a connection within `timeout`.
    static func probe(_ endpoints: [Endpoint], timeout: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            // a LAN record only carries TCP endpoints
            for target in endpoints.compactMap(\.tcp) {
                group.addTask { await TCPProbe.isReachable(host: target.host, port: target.port, timeout: timeout) }
            }
            for await reachable in group where reachable {
                group.cancelAll()
                return true
            }
            return false
        }
    }
}
