import Foundation
import PeerLink
import PeerLinkTestSupport
import Testing

/// The MultipeerConnectivity-shaped API (MultipeerSession, NearbyServiceAdvertiser,
/// NearbyServiceBrowser) in one process against the real avahi-daemon, as an MPC app uses it.
@Suite("MultipeerConnectivity-shaped API")
struct MultipeerAPITests {
    static let avahiGate: Testing.ConditionTrait = .enabled(
        if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)")

    /// A local peer with a fresh identity file of its own.
    static func freshPeer(_ name: String) throws -> MultipeerPeerID {
        try MultipeerPeerID(displayName: name, identityPath: TestHost.temporaryDirectory("mpc-\(name)") + "/identity.json")
    }

    @Test(
        "A advertises with info, B finds it, invites it with context, A accepts: connected, messages both ways, lost after A stops",
        avahiGate, .timeLimit(.minutes(2)))
    func inviteAcceptExchangeAndLose() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("m")
            let ann = try Self.freshPeer("Ann")
            let bob = try Self.freshPeer("Bob")

            let annQueue = DispatchQueue(label: "test.ann.delegate")
            annQueue.setSpecific(key: DelegateQueueCheck.key, value: "ann")
            let annSession = MultipeerSession(peer: ann, delegateQueue: annQueue)
            let annLog = SessionRecorder(expectedQueue: "ann")
            annSession.delegate = annLog
            let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: ["room": "kitchen"], serviceType: service)
            let invitations = AdvertiserRecorder { _ in (true, annSession) }
            advertiser.delegate = invitations
            advertiser.startAdvertisingPeer()

            let bobSession = MultipeerSession(peer: bob)
            let bobLog = SessionRecorder()
            bobSession.delegate = bobLog
            let browser = NearbyServiceBrowser(peer: bob, serviceType: service)
            let sightings = BrowserRecorder()
            browser.delegate = sightings
            browser.startBrowsingForPeers()

            // Found, with the discovery info; never the local peer.
            try await sightings.wait("Bob's browser finds Ann") { $0.contains { $0.isFound(ann) } }
            #expect(sightings.events.first { $0.isFound(ann) } == .found(ann, ["room": "kitchen"]))
            #expect(!sightings.events.contains { $0.isFound(bob) })
            #expect(invitations.failures.isEmpty)

            // Invitation with context, accepted.
            browser.invitePeer(ann, to: bobSession, withContext: Data("let's talk".utf8), timeout: 30)
            try await invitations.wait("Ann's advertiser gets the invitation") { !$0.isEmpty }
            #expect(invitations.invitations.first?.peer == bob)
            #expect(invitations.invitations.first?.context == Data("let's talk".utf8))
            try await annLog.wait("Ann sees Bob connected") { $0.states(of: bob).last == .connected }
            try await bobLog.wait("Bob sees Ann connected") { $0.states(of: ann).last == .connected }
            #expect(bobLog.events.states(of: ann) == [.connecting, .connected])
            #expect(annLog.events.states(of: bob) == [.connecting, .connected], "accepting makes the inviter connecting first")
            #expect(annSession.connectedPeers == [bob])
            #expect(bobSession.connectedPeers == [ann])

            // Messages both ways, in order.
            for index in 1...3 { try annSession.send(Data("from Ann \(index)".utf8), toPeers: [bob], with: .reliable) }
            try bobSession.send(Data("from Bob".utf8), toPeers: [ann], with: .reliable)
            try await bobLog.wait("Bob receives Ann's messages") { $0.messages(from: ann).count == 3 }
            try await annLog.wait("Ann receives Bob's message") { $0.messages(from: bob).count == 1 }
            #expect(bobLog.events.messages(from: ann) == (1...3).map { "from Ann \($0)" })
            #expect(annLog.events.messages(from: bob) == ["from Bob"])
            #expect(annLog.wrongQueueCalls == 0, "every delegate call arrives on the session's delegateQueue")

            // The async API's view of the same link: both sides read the same verification code.
            let annSide = try #require(await annSession.info(for: bob))
            let bobSide = try #require(await bobSession.info(for: ann))
            #expect(annSide.verificationCode == bobSide.verificationCode)
            #expect(annSide.encrypted && bobSide.encrypted, "MultipeerSession(peer:) requires encryption")

            // Stopping the advertiser: Bob's browser loses Ann; the session stays connected.
            advertiser.stopAdvertisingPeer()
            try await sightings.wait("Bob's browser loses Ann", timeout: .seconds(15)) { $0.contains(.lost(ann)) }
            #expect(annSession.connectedPeers == [bob])
            try bobSession.send(Data("still here".utf8), toPeers: [ann], with: .unreliable)

            // Once stopped, the browser reports nothing more, even when Ann is back.
            browser.stopBrowsingForPeers()
            let reported = sightings.events.count
            advertiser.startAdvertisingPeer()
            try await Task.sleep(for: .seconds(3))
            #expect(sightings.events.count == reported)
            #expect(sightings.failures.isEmpty)

            // Leaving: Bob's delegate is told at once, Ann's when the link closes.
            bobSession.disconnect()
            #expect(bobSession.connectedPeers.isEmpty)
            try await bobLog.wait("Bob's delegate sees Ann not connected") { $0.states(of: ann).last == .notConnected }
            try await annLog.wait("Ann sees Bob leave", timeout: .seconds(15)) { $0.states(of: bob).last == .notConnected }
            #expect(throws: PeerLinkError.self) {
                try annSession.send(Data("gone".utf8), toPeers: [bob], with: .reliable)
            }
            advertiser.stopAdvertisingPeer()
            annSession.disconnect()
        }
    }

    @Test("A declines: B sees A not connected and never connected; A sees nothing", avahiGate, .timeLimit(.minutes(2)))
    func inviteDeclined() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("m")
            let ann = try Self.freshPeer("Ann")
            let bob = try Self.freshPeer("Bob")

            let annSession = MultipeerSession(peer: ann, encryptionPreference: .optional)
            let annLog = SessionRecorder()
            annSession.delegate = annLog
            let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: nil, serviceType: service)
            let invitations = AdvertiserRecorder { _ in (false, nil) }
            advertiser.delegate = invitations
            advertiser.startAdvertisingPeer()

            let bobSession = MultipeerSession(peer: bob, encryptionPreference: .optional)
            let bobLog = SessionRecorder()
            bobSession.delegate = bobLog
            let browser = NearbyServiceBrowser(peer: bob, serviceType: service)
            let sightings = BrowserRecorder()
            browser.delegate = sightings
            browser.startBrowsingForPeers()
            try await sightings.wait("Bob's browser finds Ann") { $0.contains { $0.isFound(ann) } }
            #expect(sightings.events.first { $0.isFound(ann) } == .found(ann, nil), "no discovery info: nil, as in MPC")

            browser.invitePeer(ann, to: bobSession, withContext: nil, timeout: 0)
            try await invitations.wait("Ann's advertiser gets the invitation") { !$0.isEmpty }
            #expect(invitations.invitations.first?.context == nil, "no context: nil, as in MPC")
            try await bobLog.wait("Bob sees Ann not connected") { $0.states(of: ann).last == .notConnected }
            #expect(bobLog.events.states(of: ann) == [.connecting, .notConnected])
            #expect(bobSession.connectedPeers.isEmpty)
            try await Task.sleep(for: .seconds(1))
            #expect(annLog.events.states(of: bob).isEmpty)
            #expect(annSession.connectedPeers.isEmpty)

            browser.stopBrowsingForPeers()
            advertiser.stopAdvertisingPeer()
            annSession.disconnect()
            bobSession.disconnect()
        }
    }

    @Test("an invitation accepted into another session is declined; the session's delegate can refuse a peer's key", avahiGate, .timeLimit(.minutes(2)))
    func wrongSessionAndRefusedKey() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("m")
            let ann = try Self.freshPeer("Ann")
            let bob = try Self.freshPeer("Bob")

            let annSession = MultipeerSession(peer: ann)
            let elsewhere = MultipeerSession(peer: try MultipeerPeerID(displayName: "Elsewhere"))
            let annLog = SessionRecorder()
            annSession.delegate = annLog
            let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: ["v": "1"], serviceType: service)
            let invitations = AdvertiserRecorder { _ in (true, elsewhere) }
            advertiser.delegate = invitations
            advertiser.startAdvertisingPeer()

            let bobSession = MultipeerSession(peer: bob)
            let bobLog = SessionRecorder(refusing: [])
            bobSession.delegate = bobLog
            let browser = NearbyServiceBrowser(peer: bob, serviceType: service)
            let sightings = BrowserRecorder()
            browser.delegate = sightings
            browser.startBrowsingForPeers()
            try await sightings.wait("Bob's browser finds Ann") { $0.contains { $0.isFound(ann) } }

            browser.invitePeer(ann, to: bobSession, withContext: nil)
            try await invitations.wait("Ann's advertiser gets the invitation") { !$0.isEmpty }
            try await bobLog.wait("Bob sees Ann not connected") { $0.states(of: ann).last == .notConnected }
            #expect(!bobLog.events.states(of: ann).contains(.connected))

            // Bob's delegate refuses Ann's key: no invitation goes out.
            bobLog.refuse(ann)
            browser.invitePeer(ann, to: bobSession, withContext: nil)
            try await bobLog.wait("Bob is told Ann is not connected again") { $0.states(of: ann).count == 3 }
            #expect(bobLog.events.states(of: ann) == [.connecting, .notConnected, .notConnected])
            #expect(bobLog.certificates.contains(ann.fingerprint))
            try await Task.sleep(for: .seconds(1))
            #expect(invitations.invitations.count == 1)

            browser.stopBrowsingForPeers()
            advertiser.stopAdvertisingPeer()
            annSession.disconnect()
            bobSession.disconnect()
        }
    }

    @Test("peer IDs: persisted identity, equality by identity, names checked")
    func peerIDs() throws {
        let path = TestHost.temporaryDirectory("mpc-id") + "/identity.json"
        let first = try MultipeerPeerID(displayName: "Ann", identityPath: path)
        let again = try MultipeerPeerID(displayName: "Ann on the laptop", identityPath: path)
        #expect(first == again, "the same identity file is the same peer, whatever its name")
        #expect(first.fingerprint == again.fingerprint)
        #expect(try MultipeerPeerID(displayName: "Ann") != MultipeerPeerID(displayName: "Ann"), "same name, different peers")
        #expect(first.isLocal && !MultipeerPeerID(first.peerID).isLocal)
        #expect(throws: PeerLinkError.self) { try MultipeerPeerID(displayName: "") }
        #expect(throws: PeerLinkError.self) { try MultipeerPeerID(displayName: String(repeating: "a", count: 64)) }
        #expect((try? MultipeerPeerID(displayName: String(repeating: "a", count: 63))) != nil)
    }

    @Test("sends to peers not connected, to nobody, or too large throw")
    func invalidSends() throws {
        let me = try MultipeerPeerID(displayName: "Me")
        let other = MultipeerPeerID(try MultipeerPeerID(displayName: "Other").peerID)
        let session = MultipeerSession(peer: me)
        #expect(session.encryptionPreference == .required)
        #expect(MultipeerSession.maximumNumberOfPeers == 8)
        let notConnected = #expect(throws: PeerLinkError.self) { try session.send(Data([1]), toPeers: [other], with: .reliable) }
        #expect(notConnected?.code == .notConnected)
        let nobody = #expect(throws: PeerLinkError.self) { try session.send(Data([1]), toPeers: [], with: .reliable) }
        #expect(nobody?.code == .invalidParameter)
        let tooBig = #expect(throws: PeerLinkError.self) {
            try session.send(Data(count: 16385), toPeers: [other], with: .unreliable)
        }
        #expect(tooBig?.code == .invalidParameter)
        session.disconnect()
    }

    @Test("advertiser and browser report what stops them through their delegates")
    func didNotStart() async throws {
        let lonely = try MultipeerPeerID(displayName: "Lonely")
        let advertiser = NearbyServiceAdvertiser(peer: lonely, discoveryInfo: nil, serviceType: "chat")
        let advertiserLog = AdvertiserRecorder { _ in (false, nil) }
        advertiser.delegate = advertiserLog
        advertiser.startAdvertisingPeer()
        try await advertiserLog.waitForFailure("no session for the peer")
        #expect(advertiserLog.failures.first?.message.contains("make the session first") == true)

        let session = MultipeerSession(peer: lonely)
        let badType = NearbyServiceAdvertiser(peer: lonely, discoveryInfo: nil, serviceType: "Not_Valid")
        let badTypeLog = AdvertiserRecorder { _ in (false, nil) }
        badType.delegate = badTypeLog
        badType.startAdvertisingPeer()
        try await badTypeLog.waitForFailure("invalid service type")
        #expect(badTypeLog.failures.first?.code == .invalidParameter)

        let badInfo = NearbyServiceAdvertiser(peer: lonely, discoveryInfo: ["k": String(repeating: "x", count: 300)], serviceType: "chat")
        let badInfoLog = AdvertiserRecorder { _ in (false, nil) }
        badInfo.delegate = badInfoLog
        badInfo.startAdvertisingPeer()
        try await badInfoLog.waitForFailure("discovery info too large")
        #expect(badInfoLog.failures.first?.code == .invalidParameter)

        let browser = NearbyServiceBrowser(peer: lonely, serviceType: "way-too-long-service")
        let browserLog = BrowserRecorder()
        browser.delegate = browserLog
        browser.startBrowsingForPeers()
        try await browserLog.waitForFailure("service type too long")
        #expect(browserLog.failures.first?.code == .invalidParameter)
        _ = session
    }

    /// Ann's transport opens only when the test lets it (a daemon that takes its time): her
    /// `startAdvertisingPeer()` returns meanwhile, because her session opens its node on a thread
    /// of its own. Then everything happens as usual.
    @Test(
        "a transport that stalls holds up no call: advertising returns at once, the node opens and publishes once it can, and the peers connect",
        .timeLimit(.minutes(1)))
    func noCallWaitsForAStalledTransport() async throws {
        let network = MemoryNetwork()
        let gate = Gate()
        defer { gate.open() }
        let service = "stall"
        let ann = try Self.freshPeer("Ann")
        let bob = try Self.freshPeer("Bob")

        let annSession = MultipeerSession(
            peer: ann, transports: .modules([StallingModule(base: MemoryTransportModule(network: network, listenerName: "ann"), gate: gate)]))
        let annLog = SessionRecorder()
        annSession.delegate = annLog
        let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: ["room": "hall"], serviceType: service)
        let invitations = AdvertiserRecorder { _ in (true, annSession) }
        advertiser.delegate = invitations
        // A session that opened its node on the caller's thread would wait here for the gate the
        // test opens below: the gate opens by itself after 20 s, so that such a session fails
        // this test rather than hanging it.
        DispatchQueue.global().asyncAfter(deadline: .now() + 20) { gate.open() }
        advertiser.startAdvertisingPeer()
        #expect(!gate.isOpen, "startAdvertisingPeer() returned only once Ann's transport opened")
        try await waitUntil("Ann's node waits for its transport", timeout: .seconds(10), { gate.waiting }, { $0 == 1 })

        let bobSession = MultipeerSession(peer: bob, transports: .modules([MemoryTransportModule(network: network, listenerName: "bob")]))
        let bobLog = SessionRecorder()
        bobSession.delegate = bobLog
        let browser = NearbyServiceBrowser(peer: bob, serviceType: service)
        let sightings = BrowserRecorder()
        browser.delegate = sightings
        browser.startBrowsingForPeers()

        gate.open()
        try await sightings.wait("Bob's browser finds Ann once her node is open") { $0.contains { $0.isFound(ann) } }
        #expect(sightings.events.first { $0.isFound(ann) } == .found(ann, ["room": "hall"]))
        browser.invitePeer(ann, to: bobSession, withContext: Data("hello".utf8), timeout: 30)
        try await annLog.wait("Ann sees Bob connected") { $0.states(of: bob).last == .connected }
        try await bobLog.wait("Bob sees Ann connected") { $0.states(of: ann).last == .connected }
        #expect(invitations.failures.isEmpty)
        try bobSession.send(Data("hi".utf8), toPeers: [ann], with: .reliable)
        try await annLog.wait("Ann receives Bob's message") { $0.messages(from: bob) == ["hi"] }

        browser.stopBrowsingForPeers()
        advertiser.stopAdvertisingPeer()
        // Leaving and waiting for it, as a process does before it exits: the call returns once
        // the goodbye went out, long before its timeout, and Ann sees Bob leave (not lose his
        // link, which she would keep for her 30 s reconnect grace).
        let leaving = ContinuousClock.now
        #expect(await bobSession.disconnect(waitingUpTo: .seconds(20)))
        #expect(ContinuousClock.now - leaving < .seconds(10))
        #expect(bobSession.connectedPeers.isEmpty)
        try await annLog.wait("Ann sees Bob leave", timeout: .seconds(15)) { $0.states(of: bob).last == .notConnected }
        // Nothing to leave: at once.
        #expect(await bobSession.disconnect(waitingUpTo: .seconds(20)))
        annSession.disconnect()
    }

    /// A goodbye that cannot go out (the node is still waiting for its transport) holds the
    /// caller no longer than it said.
    @Test("disconnect(waitingUpTo:) returns false at its timeout while the node still waits for a stalled transport", .timeLimit(.minutes(1)))
    func leavingWaitsNoLongerThanItsTimeout() async throws {
        let gate = Gate()
        defer { gate.open() }
        let ann = try Self.freshPeer("Ann")
        let session = MultipeerSession(
            peer: ann, transports: .modules([StallingModule(base: MemoryTransportModule(network: MemoryNetwork(), listenerName: "ann"), gate: gate)]))
        let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: nil, serviceType: "stall")
        advertiser.startAdvertisingPeer()
        try await waitUntil("Ann's node waits for its transport", timeout: .seconds(10), { gate.waiting }, { $0 == 1 })
        let leaving = ContinuousClock.now
        #expect(await !session.disconnect(waitingUpTo: .milliseconds(300)))
        #expect(ContinuousClock.now - leaving < .seconds(5), "the timeout bounds the wait")
        #expect(!gate.isOpen)
        advertiser.stopAdvertisingPeer()
    }

    /// A node that cannot open (its only transport cannot run here) is found out after the call
    /// that needed it returned; the advertiser's delegate and the invited peer's state say so,
    /// as when the node failed at once, and the session is free to serve another service type.
    @Test("a session whose transports cannot run tells its advertiser, and a peer it invites is not connected", .timeLimit(.minutes(1)))
    func transportsThatCannotRunAreReported() async throws {
        let network = MemoryNetwork()
        let noRadio = PeerLinkError(.unavailable, "no radio here")
        let ann = try Self.freshPeer("Ann")
        let session = MultipeerSession(
            peer: ann, transports: .modules([MemoryTransportModule(network: network, listenerName: "ann", faults: .init(links: noRadio))]))
        let log = SessionRecorder()
        session.delegate = log

        let advertiser = NearbyServiceAdvertiser(peer: ann, discoveryInfo: nil, serviceType: "radio")
        let advertiserLog = AdvertiserRecorder { _ in (false, nil) }
        advertiser.delegate = advertiserLog
        advertiser.startAdvertisingPeer()
        try await advertiserLog.waitForFailure("Ann's transport cannot run")
        #expect(advertiserLog.failures.map(\.message) == ["no radio here"])
        #expect(session.serviceType == nil, "no node served the service type")

        let bob = try Self.freshPeer("Bob")
        let browser = NearbyServiceBrowser(peer: ann, serviceType: "other")
        browser.invitePeer(bob, to: session, withContext: nil)
        try await log.wait("Bob is not connected: the invitation was not sent") { $0.states(of: bob) == [.notConnected] }
        #expect(log.certificates.isEmpty, "the delegate is asked about a peer's key only once the invitation can go")
    }
}

// MARK: - A transport that stalls

/// Lets threads through once it is opened.
final class Gate: @unchecked Sendable {
    private let condition = NSCondition()
    private var opened = false
    private var waiters = 0

    /// Threads waiting in ``pass()`` now.
    var waiting: Int { condition.withLock { waiters } }
    var isOpen: Bool { condition.withLock { opened } }

    /// Waits until the gate is open.
    func pass() {
        condition.withLock {
            waiters += 1
            while !opened { condition.wait() }
            waiters -= 1
        }
    }

    func open() {
        condition.withLock {
            opened = true
            condition.broadcast()
        }
    }
}

/// A transport module whose links open only once `gate` is open: a daemon that takes its time.
struct StallingModule: TransportModule {
    let base: MemoryTransportModule
    let gate: Gate

    var name: String { base.name }
    var kinds: [TransportKind] { base.kinds }
    var endpointSchemes: [EndpointScheme] { base.endpointSchemes }

    func openLinks(limits: ResourceLimits) throws(PeerLinkError) -> TransportLinks {
        gate.pass()
        return try base.openLinks(limits: limits)
    }

    func advertise(_ advertisement: Advertisement, at endpoints: [Endpoint]) throws(PeerLinkError) -> any TransportAdvertiser {
        try base.advertise(advertisement, at: endpoints)
    }

    func browser(_ request: BrowseRequest) -> any TransportBrowser { base.browser(request) }
}

// MARK: - Delegates that record

/// Tells delegate calls made on a test's queue from others.
enum DelegateQueueCheck {
    static let key = DispatchSpecificKey<String>()
}

/// Waits, polling, until `condition` holds for what `read` returns.
private func waitUntil<T>(
    _ what: String, timeout: Duration, _ read: () -> T, _ condition: (T) -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while !condition(read()) {
        guard ContinuousClock.now < deadline else { throw HarnessError("\(what): not within \(timeout); saw \(read())") }
        try await Task.sleep(for: .milliseconds(50))
    }
}

final class SessionRecorder: MultipeerSessionDelegate {
    enum Event: Equatable, Sendable {
        case state(MultipeerPeerID, PeerState)
        case data(Data, MultipeerPeerID)
    }

    private struct Log {
        var events: [Event] = []
        var wrongQueueCalls = 0
        var refused: Set<MultipeerPeerID> = []
        var certificates: [Fingerprint] = []
    }

    private let log: Locked<Log>
    private let expectedQueue: String?

    init(expectedQueue: String? = nil, refusing: Set<MultipeerPeerID> = []) {
        self.expectedQueue = expectedQueue
        log = Locked(Log(refused: refusing))
    }

    var events: [Event] { log.withLock { $0.events } }
    var wrongQueueCalls: Int { log.withLock { $0.wrongQueueCalls } }
    var certificates: [Fingerprint] { log.withLock { $0.certificates } }
    func refuse(_ peer: MultipeerPeerID) { log.withLock { _ = $0.refused.insert(peer) } }

    private func record(_ event: Event) {
        let onQueue = expectedQueue.map { DispatchQueue.getSpecific(key: DelegateQueueCheck.key) == $0 } ?? true
        log.withLock { log in
            log.events.append(event)
            if !onQueue { log.wrongQueueCalls += 1 }
        }
    }

    func session(_ session: MultipeerSession, peer peerID: MultipeerPeerID, didChange state: PeerState) {
        record(.state(peerID, state))
    }

    func session(_ session: MultipeerSession, didReceive data: Data, fromPeer peerID: MultipeerPeerID) {
        record(.data(data, peerID))
    }

    func session(
        _ session: MultipeerSession, didReceiveCertificate fingerprint: Fingerprint, fromPeer peerID: MultipeerPeerID,
        certificateHandler: @escaping @Sendable (Bool) -> Void
    ) {
        let refused = log.withLock { log in
            log.certificates.append(fingerprint)
            return log.refused.contains(peerID)
        }
        certificateHandler(!refused)
    }

    func wait(_ what: String, timeout: Duration = .seconds(30), until condition: ([Event]) -> Bool) async throws {
        try await waitUntil(what, timeout: timeout, { events }, condition)
    }
}

extension [SessionRecorder.Event] {
    func states(of peer: MultipeerPeerID) -> [PeerState] {
        compactMap { if case .state(let who, let state) = $0, who == peer { state } else { nil } }
    }

    func messages(from peer: MultipeerPeerID) -> [String] {
        compactMap { if case .data(let data, let who) = $0, who == peer { String(decoding: data, as: UTF8.self) } else { nil } }
    }
}

final class AdvertiserRecorder: NearbyServiceAdvertiserDelegate {
    struct Invitation: Sendable {
        var peer: MultipeerPeerID
        var context: Data?
    }

    private let log = Locked<([Invitation], [PeerLinkError])>(([], []))
    private let answer: @Sendable (MultipeerPeerID) -> (Bool, MultipeerSession?)

    init(answer: @escaping @Sendable (MultipeerPeerID) -> (Bool, MultipeerSession?)) {
        self.answer = answer
    }

    var invitations: [Invitation] { log.withLock { $0.0 } }
    var failures: [PeerLinkError] { log.withLock { $0.1 } }

    func advertiser(
        _ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peerID: MultipeerPeerID, withContext context: Data?,
        invitationHandler: @escaping @Sendable (Bool, MultipeerSession?) -> Void
    ) {
        log.withLock { $0.0.append(Invitation(peer: peerID, context: context)) }
        let (accept, session) = answer(peerID)
        invitationHandler(accept, session)
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: any Error) {
        log.withLock { $0.1.append(error as? PeerLinkError ?? PeerLinkError(.unknown, "\(error)")) }
    }

    func wait(_ what: String, timeout: Duration = .seconds(30), until condition: ([Invitation]) -> Bool) async throws {
        try await waitUntil(what, timeout: timeout, { invitations }, condition)
    }

    func waitForFailure(_ what: String) async throws {
        try await waitUntil(what, timeout: .seconds(10), { failures }, { !$0.isEmpty })
    }
}

final class BrowserRecorder: NearbyServiceBrowserDelegate {
    enum Event: Equatable, Sendable {
        case found(MultipeerPeerID, [String: String]?)
        case lost(MultipeerPeerID)

        func isFound(_ peer: MultipeerPeerID) -> Bool {
            if case .found(let who, _) = self { who == peer } else { false }
        }
    }

    private let log = Locked<([Event], [PeerLinkError])>(([], []))

    var events: [Event] { log.withLock { $0.0 } }
    var failures: [PeerLinkError] { log.withLock { $0.1 } }

    func browser(_ browser: NearbyServiceBrowser, foundPeer peerID: MultipeerPeerID, withDiscoveryInfo info: [String: String]?) {
        log.withLock { $0.0.append(.found(peerID, info)) }
    }

    func browser(_ browser: NearbyServiceBrowser, lostPeer peerID: MultipeerPeerID) {
        log.withLock { $0.0.append(.lost(peerID)) }
    }

    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: any Error) {
        log.withLock { $0.1.append(error as? PeerLinkError ?? PeerLinkError(.unknown, "\(error)")) }
    }

    func wait(_ what: String, timeout: Duration = .seconds(30), until condition: ([Event]) -> Bool) async throws {
        try await waitUntil(what, timeout: timeout, { events }, condition)
    }

    func waitForFailure(_ what: String) async throws {
        try await waitUntil(what, timeout: .seconds(10), { failures }, { !$0.isEmpty })
    }
}
