import Foundation
import PeerLink
import PeerLinkCore
import PeerLinkLAN
import Testing

@Suite(
    "LAN discovery through the real avahi-daemon",
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct LANDiscoveryTests {
    @Test("advertise in one process, scan from another", .timeLimit(.minutes(1)))
    func advertiseThenScan() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType()
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Alice", "--service", service, "--info", "color=blue"])
            try await advertiser.waitForLine(containing: "Published as \"Alice\"")
            let id = try await advertiser.advertisedID()
            let peers = try await scanPeers(service: service)
            #expect(peers.count == 1)
            let alice = try #require(peers.first)
            #expect(alice.name == "Alice")
            #expect(alice.id == id)
            #expect(alice.info == ["color": "blue"])
            let endpoint = try #require(alice.endpoints.first)
            #expect(endpoint.transport == "tcp")
            #expect(["127.0.0.1", "::1"].contains(endpoint.host), "a peer on this host is reached over loopback, got \(endpoint.host)")
            advertiser.signal(SIGINT)
            #expect(try await advertiser.waitForExit() == 0)
        }
    }

    @Test("two peers with the same name: Avahi renames the second instance, both are found as Alice", .timeLimit(.minutes(1)))
    func sameDisplayName() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType()
            let first = try ChildProcess.peerlink(["advertise", "--name", "Alice", "--service", service])
            try await first.waitForLine(containing: "Published as \"Alice\"")
            let second = try ChildProcess.peerlink(["advertise", "--name", "Alice", "--service", service])
            let taken = try await second.waitForLine(containing: "is taken")
            #expect(taken.contains("\"Alice\"") && taken.contains("\"Alice #2\""), "the message names the old and the new instance name: \(taken)")
            try await second.waitForLine(containing: "Published as \"Alice #2\"")

            let peers = try await scanUntil(service: service) { $0.count >= 2 }
            #expect(peers.count == 2)
            #expect(peers.map(\.name) == ["Alice", "Alice"], "the display name stays Alice; only the DNS-SD instance name changes")
            #expect(Set(peers.map(\.id)).count == 2, "two identities: \(peers.map(\.id))")

            // What the network carries: two instances, the second renamed, both with plname=Alice.
            let browsed = try await AvahiBrowse.services(service)
            #expect(Set(browsed.map(\.name)) == ["Alice", "Alice #2"])
            #expect(browsed.allSatisfy { $0.txtDictionary["plname"] == "Alice" }, "\(browsed)")

            first.signal(SIGINT)
            second.signal(SIGINT)
            #expect(try await first.waitForExit() == 0)
            #expect(try await second.waitForExit() == 0)
        }
    }

    @Test("SIGINT and SIGTERM withdraw the advertisement and exit 0", .timeLimit(.minutes(1)), arguments: [SIGINT, SIGTERM])
    func withdrawOnSignal(signal: Int32) async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("w")
            let name = "Withdraw\(signal)"
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", name, "--service", service])
            try await advertiser.waitForLine(containing: "Published as")
            #expect(try await AvahiBrowse.services(service, resolve: false).map(\.name) == [name])

            advertiser.signal(signal)
            #expect(try await advertiser.waitForExit(timeout: .seconds(10)) == 0)
            #expect(advertiser.stdout.contains("Withdrawn"), "stdout:\n\(advertiser.stdout)")

            // Gone from the daemon: avahi-browse no longer lists it (the goodbye may take a moment).
            let deadline = ContinuousClock.now + .seconds(8)
            var browsed = try await AvahiBrowse.services(service, resolve: false)
            while !browsed.isEmpty && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(250))
                browsed = try await AvahiBrowse.services(service, resolve: false)
            }
            #expect(browsed.isEmpty, "still published after exit: \(browsed)")
            #expect(try await scanPeers(service: service, timeout: 2).isEmpty)
        }
    }

    @Test("kill -9 of an advertiser: a watching scan reports it lost within 10 s", .timeLimit(.minutes(1)))
    func killedAdvertiserIsLost() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("k")
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Doomed", "--service", service])
            try await advertiser.waitForLine(containing: "Published as")
            let id = try await advertiser.advertisedID()
            let watch = try ChildProcess.peerlink(["scan", "--lan", "--service", service, "--watch", "--json", "--timeout", "20"])
            try await watch.waitForLine(timeout: .seconds(10)) { WatchLine.parse($0).map { $0.event == "found" && $0.peerID == id } ?? false }

            let killed = ContinuousClock.now
            advertiser.signal(SIGKILL)
            let lost = try await watch.waitForTimedLine(timeout: .seconds(15)) {
                WatchLine.parse($0).map { $0.event == "lost" && $0.peerID == id } ?? false
            }
            let delay = killed.duration(to: lost.time)
            #expect(delay <= .seconds(10), "lost after \(delay)")
            #expect(lost.text.contains("\"event\":\"lost\""))
            watch.terminate()
        }
    }
}

/// The promise of ``PeerLinkCore/LivenessPolicy``: a vanished peer is reported lost within its
/// `timeout`. Run on its own by Hardware/test.sh (like the suites it lists as alone): when the
/// integration process starts, some two hundred tests begin at once on its few cooperative
/// threads, and a browser's 100 ms ticks and probes wait their turn for seconds (a peer closed at
/// once was seen lost 3.1-3.5 s later, where the policy's worst case is 1.8 s).
@Suite(
    "LAN liveness on time: a vanished peer is lost within the policy's timeout", .serialized,
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct LivenessTimingTests {
    @Test("LANBrowser with LivenessPolicy(timeout: 3 s) reports a killed advertiser lost within 3 s", .timeLimit(.minutes(1)))
    func inProcessBrowserKilledAdvertiser() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("b")
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Short", "--service", service])
            try await advertiser.waitForLine(containing: "Published as")
            let id = try await advertiser.advertisedID()

            let recorder = try await EventRecorder(LANBrowser(serviceType: ServiceType(service), liveness: LivenessPolicy(timeout: .seconds(3))))
            defer { recorder.stop() }
            try await recorder.waitFor(timeout: .seconds(10)) { if case .found(let peer) = $0 { peer.id.fingerprint.value == id } else { false } }

            let killed = ContinuousClock.now
            advertiser.signal(SIGKILL)
            let lost = try await recorder.waitFor(timeout: .seconds(10)) { if case .lost(let peer) = $0 { peer.fingerprint.value == id } else { false } }
            let delay = killed.duration(to: lost.time)
            #expect(delay <= .seconds(3), "lost after \(delay)")
        }
    }

    @Test(
        "LANBrowser with LivenessPolicy(timeout: 3 s) reports a peer whose record lingers but whose port is dead lost within 3 s",
        .timeLimit(.minutes(1)))
    func inProcessBrowserStaleRecord() async throws {
        let publish = try #require(TestHost.which("avahi-publish"), "avahi-publish is not installed (apt-get install avahi-utils)")
        try await withSharedAvahi {
            // The record stays published (avahi-publish keeps running): only the liveness probes
            // can tell that nobody answers on the port any more.
            let service = TestHost.uniqueServiceType("s")
            let id = TestHost.randomFingerprint()
            let listener = try TCPListener()
            let publisher = try ChildProcess(publish, ["-s", "Stale", "_\(service)._tcp", String(listener.port), "plv=1", "plid=\(id)", "plname=Stale"])
            defer { publisher.terminate() }
            try await publisher.waitForStderrLine(containing: "Established", timeout: .seconds(10))

            let recorder = try await EventRecorder(LANBrowser(serviceType: ServiceType(service), liveness: LivenessPolicy(timeout: .seconds(3))))
            defer { recorder.stop() }
            try await recorder.waitFor(timeout: .seconds(10)) { if case .found(let peer) = $0 { peer.id.fingerprint.value == id } else { false } }

            let closed = ContinuousClock.now
            listener.close()
            let lost = try await recorder.waitFor(timeout: .seconds(10)) { if case .lost(let peer) = $0 { peer.fingerprint.value == id } else { false } }
            let delay = closed.duration(to: lost.time)
            #expect(delay <= .seconds(3), "lost after \(delay)")
            #expect(try await AvahiBrowse.services(service).map(\.name) == ["Stale"], "the record was still published: the probes found it dead")
        }
    }
}

/// Collects a browser's events with the time each arrived, for tests to wait on.
final class EventRecorder: @unchecked Sendable {
    struct Recorded: Sendable {
        var event: DiscoveryEvent
        var time: ContinuousClock.Instant
    }

    private let lock = NSLock()
    private var recorded: [Recorded] = []
    private var consumer: Task<Void, Never>?

    init(_ browser: LANBrowser) async throws {
        let events = try await browser.events()
        consumer = Task { [weak self] in
            for await event in events {
                guard let self else { return }
                let now = ContinuousClock.now
                self.lock.withLock { self.recorded.append(Recorded(event: event, time: now)) }
            }
        }
    }

    var events: [Recorded] { lock.withLock { recorded } }

    /// Waits (bounded) for an event satisfying `match`.
    @discardableResult
    func waitFor(timeout: Duration, _ match: (DiscoveryEvent) -> Bool) async throws -> Recorded {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let hit = events.first(where: { match($0.event) }) { return hit }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw HarnessError("no matching browser event within \(timeout); events: \(events.map(\.event))")
    }

    /// Stops browsing (cancelling the consumer ends the stream, which stops the Avahi browser).
    func stop() {
        consumer?.cancel()
    }

    deinit { consumer?.cancel() }
}

@Suite(
    "without avahi-daemon: exit 69 and a message that says so",
    .enabled(if: TestHost.which("dbus-daemon") != nil || TestHost.daemonsRequired, "dbus-daemon is not installed (needed for a private bus without avahi)"))
struct MissingDaemonTests {
    @Test("scan and advertise on a D-Bus without avahi: exit 69, 'avahi-daemon is not running'", .timeLimit(.minutes(1)))
    func busWithoutAvahi() async throws {
        let bus = try await PrivateBus()
        let environment = ["DBUS_SYSTEM_BUS_ADDRESS": bus.address]
        let scan = try await runPeerlink(["scan", "--lan", "--service", TestHost.uniqueServiceType(), "--timeout", "1"], environment: environment)
        #expect(scan.status == 69, "scan: stderr:\n\(scan.stderr)")
        #expect(scan.stderr.contains("avahi-daemon is not running"), "scan: stderr:\n\(scan.stderr)")

        let advertise = try await runPeerlink(["advertise", "--name", "Nobody", "--service", TestHost.uniqueServiceType()], environment: environment, timeout: .seconds(15))
        #expect(advertise.status == 69, "advertise: stderr:\n\(advertise.stderr)")
        #expect(advertise.stderr.contains("avahi-daemon is not running"), "advertise: stderr:\n\(advertise.stderr)")
    }

    @Test("radios without avahi: exit 0, avahi reported not running with the reason", .timeLimit(.minutes(1)))
    func radiosWithoutAvahi() async throws {
        let bus = try await PrivateBus()
        let radios = try await runPeerlink(["radios", "--json"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
        #expect(radios.status == 0, "stderr:\n\(radios.stderr)")
        let object = try #require(try? JSONSerialization.jsonObject(with: Data(radios.stdout.utf8)) as? [String: Any], "not JSON:\n\(radios.stdout)")
        let avahi = try #require(object["avahi"] as? [String: Any])
        #expect(avahi["running"] as? Bool == false)
        #expect((avahi["problem"] as? String)?.contains("avahi-daemon is not running") == true, "\(avahi)")
    }

    @Test("no system D-Bus at all: exit 69 and a message naming avahi-daemon and the bus", .timeLimit(.minutes(1)))
    func noBusAtAll() async throws {
        let environment = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent"]
        let scan = try await runPeerlink(["scan", "--lan", "--service", TestHost.uniqueServiceType(), "--timeout", "1"], environment: environment)
        #expect(scan.status == 69, "scan: stderr:\n\(scan.stderr)")
        #expect(scan.stderr.contains("avahi-daemon"), "scan: stderr:\n\(scan.stderr)")
        #expect(scan.stderr.localizedCaseInsensitiveContains("D-Bus"), "the message should say the system D-Bus is unreachable: \(scan.stderr)")

        let advertise = try await runPeerlink(["advertise", "--name", "Nobody", "--service", TestHost.uniqueServiceType()], environment: environment, timeout: .seconds(15))
        #expect(advertise.status == 69, "advertise: stderr:\n\(advertise.stderr)")
        #expect(advertise.stderr.contains("avahi-daemon"), "advertise: stderr:\n\(advertise.stderr)")
        #expect(advertise.stderr.localizedCaseInsensitiveContains("D-Bus"), "the message should say the system D-Bus is unreachable: \(advertise.stderr)")
    }
}

@Suite(
    "avahi-daemon restarts under a running peer",
    .serialized,
    .enabled(
        if: TestHost.daemonsScript != nil || TestHost.daemonsRequired,
        "PEERLINK_DAEMONS_SCRIPT is not set: only Hardware/test.sh (or CI) may restart the avahi-daemon it started"),
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
struct DaemonRestartTests {
    @Test("the advertiser says avahi went away, publishes again, and is found", .timeLimit(.minutes(2)))
    func advertiserRepublishes() async throws {
        try await AvahiDaemonGate.shared.exclusive {
            defer { DaemonsScript.ensureAvahiRunning() }
            let service = TestHost.uniqueServiceType("r")
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Phoenix", "--service", service, "--transport", "lan"])
            try await advertiser.waitForLine(containing: "Published as \"Phoenix\"")
            let id = try await advertiser.advertisedID()
            let before = advertiser.stdoutLines.count

            try await DaemonsScript.run("restart-avahi")

            try await advertiser.waitForLine(containing: "avahi-daemon went away", after: before, timeout: .seconds(10))
            try await advertiser.waitForLine(containing: "Published as \"Phoenix\"", after: before, timeout: .seconds(15))
            let peers = try await scanUntil(service: service, within: .seconds(15)) { $0.contains { $0.id == id } }
            #expect(peers.map(\.id) == [id])
            #expect(!advertiser.stderr.contains("failed"), "stderr:\n\(advertiser.stderr)")
            advertiser.signal(SIGINT)
            #expect(try await advertiser.waitForExit() == 0)
        }
    }

    /// avahi-client waits for every answer from avahi-daemon (D-Bus, up to 25 s): a browse
    /// started while the daemon hangs must wait on a thread of its own, not on the thread it was
    /// started from — on a cooperative thread that is a CPU's worth of every task in the
    /// process, on an event loop every link. The daemon hangs here for real (stopped with
    /// SIGSTOP, the one daemons.sh started, while no other test uses it).
    @Test("a browse started while avahi-daemon hangs waits off the caller's thread, then browses", .timeLimit(.minutes(2)))
    func browseWaitsOffTheCallersThread() async throws {
        try await Self.withAvahiStopped { resume in
            let service = TestHost.uniqueServiceType("h")
            let browser = LANBrowser(serviceType: try ServiceType(service))
            let loop = OneThreadExecutor()
            let browse = Task(executorPreference: loop) { try await browser.events() }
            // Queued behind the browse's first job on the same thread: it runs once that job
            // lets the thread go, at once unless the browse holds it while the daemon is silent.
            let asked = ContinuousClock.now
            let answered = await Task(executorPreference: loop) { ContinuousClock.now }.value
            #expect(asked.duration(to: answered) < .seconds(2), "the browse held the thread it was started from while avahi-daemon hung")
            resume()
            // Once the daemon answers, the browse runs and finds a peer.
            let events = try await browse.value
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Thawed", "--service", service, "--transport", "lan"])
            try await advertiser.waitForLine(containing: "Published as \"Thawed\"")
            let found = try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    for await event in events {
                        if case .found(let peer) = event, peer.id.displayName == "Thawed" { return true }
                    }
                    return false
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(20))
                    return false
                }
                let first = try await group.next() ?? false
                group.cancelAll()
                return first
            }
            #expect(found, "the browse did not find the peer within 20 s of avahi-daemon answering again")
            advertiser.signal(SIGINT)
            _ = try await advertiser.waitForExit()
        }
    }

    @Test("a browse that avahi-daemon never answers fails when libdbus gives up, saying the daemon hangs", .timeLimit(.minutes(2)))
    func unansweredBrowseSaysTheDaemonHangs() async throws {
        try await Self.withAvahiStopped { _ in
            let browser = LANBrowser(serviceType: try ServiceType(TestHost.uniqueServiceType("h")))
            let start = ContinuousClock.now
            do throws(PeerLinkError) {
                _ = try await browser.events()
                Issue.record("the browse started against a stopped avahi-daemon")
            } catch {
                #expect(error.code == .unavailable)
                #expect(error.message.hasPrefix("avahi-daemon does not answer"), "\(error.message)")
                #expect(error.message.contains("systemctl restart avahi-daemon"), "\(error.message)")
            }
            #expect(start.duration(to: .now) >= .seconds(10), "libdbus waits 25 s for a reply")
        }
    }

    @Test("cancelling a browse that waits for a hung avahi-daemon ends the wait at once", .timeLimit(.minutes(1)))
    func cancelledBrowseStopsWaiting() async throws {
        try await Self.withAvahiStopped { _ in
            let browser = LANBrowser(serviceType: try ServiceType(TestHost.uniqueServiceType("h")))
            let browse = Task { try await browser.events() }
            try await Task.sleep(for: .milliseconds(300))
            let cancelled = ContinuousClock.now
            browse.cancel()
            let result = await browse.result
            #expect(cancelled.duration(to: .now) < .seconds(2), "the browse went on waiting for the daemon after its task was cancelled")
            switch result {
            case .success:
                Issue.record("a browse started while avahi-daemon was stopped")
            case .failure(let error as PeerLinkError):
                #expect(error.code == .cancelled, "\(error.message)")
            case .failure(let error):
                Issue.record("not a PeerLinkError: \(error)")
            }
        }
    }

    /// Runs `body` while the avahi-daemon daemons.sh started is stopped (SIGSTOP: it holds its
    /// D-Bus name and answers nothing, as a hung daemon does) and no other test uses it. It goes
    /// on (SIGCONT) when `body` calls `resume`, and when `body` ends in any case.
    static func withAvahiStopped(_ body: (_ resume: @Sendable () -> Void) async throws -> Void) async throws {
        try await AvahiDaemonGate.shared.exclusive {
            defer { DaemonsScript.ensureAvahiRunning() }
            let pid = try await avahiStartedByDaemonsScript()
            #expect(kill(pid, SIGSTOP) == 0)
            let resume: @Sendable () -> Void = { kill(pid, SIGCONT) }
            defer { resume() }
            try await body(resume)
        }
    }

    /// The pid of the avahi-daemon daemons.sh started; an error for any other (a test stops only
    /// its own daemon).
    static func avahiStartedByDaemonsScript() async throws -> Int32 {
        let status = try await DaemonsScript.run("status")
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("avahi: running, pid ") }),
            line.contains("started by daemons.sh"),
            let pid = Int32(line.dropFirst("avahi: running, pid ".count).prefix(while: \.isNumber))
        else { throw HarnessError("this test stops only the avahi-daemon daemons.sh started; status:\n\(status)") }
        return pid
    }

    @Test("a scan running across the restart still finds a peer published after it", .timeLimit(.minutes(2)))
    func watchingScanSurvives() async throws {
        try await AvahiDaemonGate.shared.exclusive {
            defer { DaemonsScript.ensureAvahiRunning() }
            let service = TestHost.uniqueServiceType("r")
            let watch = try ChildProcess.peerlink(["scan", "--lan", "--service", service, "--watch", "--json", "--timeout", "40"])
            let early = try ChildProcess.peerlink(["advertise", "--name", "Early", "--service", service])
            let earlyID = try await early.advertisedID()
            try await watch.waitForLine(timeout: .seconds(10)) { WatchLine.parse($0).map { $0.event == "found" && $0.peerID == earlyID } ?? false }

            try await DaemonsScript.run("restart-avahi")

            let late = try ChildProcess.peerlink(["advertise", "--name", "Late", "--service", service])
            try await late.waitForLine(containing: "Published as \"Late\"", timeout: .seconds(15))
            let lateID = try await late.advertisedID()
            try await watch.waitForLine(timeout: .seconds(15)) { WatchLine.parse($0).map { $0.event == "found" && $0.peerID == lateID } ?? false }
            #expect(!watch.stderr.contains("failed"), "stderr:\n\(watch.stderr)")
            watch.terminate()
            early.signal(SIGINT)
            late.signal(SIGINT)
            _ = try await early.waitForExit()
            _ = try await late.waitForExit()
        }
    }
}

/// A task executor with one thread of its own, running its jobs in the order they came: the
/// shape of an event loop, to see whether a call holds the thread it was made on.
final class OneThreadExecutor: TaskExecutor, @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    init() {
        // The thread lives as long as the process (one per test that makes one).
        Thread.detachNewThread { [self] in
            while true {
                condition.lock()
                while jobs.isEmpty { condition.wait() }
                let batch = jobs
                jobs.removeAll()
                condition.unlock()
                for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
            }
        }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }
}
