import Logging
import PeerLinkCore

/// What a ``PeerDiscovery`` reports.
public enum PeerDiscoveryEvent: Sendable {
    /// A merged change: a peer found on its first transport, updated, lost on its last.
    case peer(DiscoveryEvent)
    /// The browser of module `module` runs.
    case browsing(module: String, label: String)
    /// The browser of module `module` cannot run: `error` says why and what to do.
    case unavailable(module: String, label: String, PeerLinkError)
}

/// Browses with every transport module at once and merges what the browsers find by identity
/// (``PeerLinkCore/MergedDiscovery``): one peer, every endpoint, best first by a
/// ``PeerLinkCore/TransportRanking``. A ``PeerNode`` runs one; `peerlink scan` runs one alone.
public final class PeerDiscovery: Sendable {
    public let request: BrowseRequest
    public let ranking: TransportRanking
    private let browsers: [(module: String, label: String, browser: any TransportBrowser)]
    private let merged: Locked<MergedDiscovery>
    private let logger: Logger

    private enum Input: Sendable {
        case started
        case event(DiscoveryEvent)
        case failed(PeerLinkError)
    }

    /// - Parameters:
    ///   - modules: the transports to browse with; each makes its browser for `request`.
    public init(
        modules: [any TransportModule], request: BrowseRequest, ranking: TransportRanking = .standard,
        logger: Logger = Logger(label: "peerlink")
    ) {
        self.request = request
        self.ranking = ranking
        self.logger = logger
        browsers = modules.map { ($0.name, $0.label, $0.browser(request)) }
        merged = Locked(MergedDiscovery(ranking: ranking))
    }

    /// The names of the modules browsed.
    public var modules: [String] { browsers.map(\.module) }

    /// The peers found now, merged, by fingerprint.
    public var peers: [DiscoveredPeer] { merged.withLock { $0.peers } }

    /// The merged peer `fingerprint`, when found.
    public func peer(_ fingerprint: Fingerprint) -> DiscoveredPeer? { merged.withLock { $0.peer(fingerprint) } }

    /// Merges a report from elsewhere (an endpoint the app connected to, named `source`);
    /// returns the merged events it causes (which ``run(_:)`` does not report).
    public func apply(_ event: DiscoveryEvent, from source: String) -> [DiscoveryEvent] {
        merged.withLock { $0.apply(event, from: source) }
    }

    /// The tables the browsers can show after a scan (Bluetooth: every device seen).
    public func scanReports() -> [TransportScanReport] {
        browsers.compactMap { $0.browser.scanReport() }
    }

    /// Runs every browser until the task is cancelled. `report` gets every merged change and
    /// each browser's start or failure, one at a time, in order, from this task.
    public func run(_ report: @Sendable (PeerDiscoveryEvent) async -> Void) async {
        let (inputs, input) = AsyncStream.makeStream(of: (Int, Input).self)
        await withTaskGroup(of: Void.self) { group in
            for (index, entry) in browsers.enumerated() {
                group.addTask {
                    do throws(PeerLinkError) {
                        let events = try await entry.browser.events()
                        input.yield((index, .started))
                        for await event in events { input.yield((index, .event(event))) }
                    } catch {
                        input.yield((index, .failed(error)))
                    }
                }
            }
            for await (index, next) in inputs {
                let (module, label, _) = browsers[index]
                switch next {
                case .started:
                    await report(.browsing(module: module, label: label))
                case .failed(let error):
                    logger.info("browsing failed", metadata: ["transport": "\(module)", "reason": "\(error.message)"])
                    await report(.unavailable(module: module, label: label, error))
                case .event(let event):
                    let changes = merged.withLock { $0.apply(event, from: module) }
                    for change in changes { await report(.peer(change)) }
                }
            }
            group.cancelAll()
        }
    }
}
