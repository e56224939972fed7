import Foundation
import PeerLink
import Testing

/// What other DNS-SD software sees of us, and what we make of what it publishes.
@Suite(
    "interoperability with avahi-utils and python-zeroconf",
    .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"),
    .enabled(
        if: (TestHost.which("avahi-browse") != nil && TestHost.which("avahi-publish") != nil) || TestHost.daemonsRequired,
        "avahi-browse / avahi-publish are not installed (apt-get install avahi-utils, or Hardware/setup.sh)"))
struct InteropTests {
    /// A foreign publisher: `avahi-publish -s NAME _<service>._tcp PORT TXT...`, running until
    /// the test ends.
    private static func publish(_ name: String, service: String, port: UInt16, txt: [String]) async throws -> ChildProcess {
        let publisher = try startPublishing(name, service: service, port: port, txt: txt)
        try await publisher.waitForStderrLine(containing: "Established under name '\(name)'", timeout: .seconds(10))
        return publisher
    }

    /// Starts avahi-publish without waiting for it to be established.
    private static func startPublishing(_ name: String, service: String, port: UInt16, txt: [String]) throws -> ChildProcess {
        let tool = try #require(TestHost.which("avahi-publish"), "avahi-publish is not installed (apt-get install avahi-utils)")
        return try ChildProcess(tool, ["-s", name, "_\(service)._tcp", String(port)] + txt)
    }

    @Test("avahi-browse sees our TXT record: plv, plid, plname and the info entries", .timeLimit(.minutes(1)))
    func avahiBrowseSeesTXT() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("x")
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Inter Op", "--service", service, "--info", "color=blue", "--info", "size=xl"])
            try await advertiser.waitForLine(containing: "Published as")
            let peer = try #require(try await scanPeers(service: service).first)

            let browsed = try await AvahiBrowse.services(service)
            #expect(browsed.count == 1, "\(browsed)")
            let record = try #require(browsed.first)
            #expect(record.name == "Inter Op")
            let txt = record.txtDictionary
            #expect(txt["plv"] == "1")
            #expect(txt["plid"] == peer.id, "plid \(txt["plid"] ?? "none") vs scan id \(peer.id)")
            #expect(txt["plid"]?.count == 16)
            #expect(txt["plname"] == "Inter Op")
            #expect(txt["color"] == "blue")
            #expect(txt["size"] == "xl")
            #expect(Set(txt.keys) == ["plv", "plid", "plname", "color", "size"], "no other TXT entries: \(record.txt ?? [])")
            #expect(record.port == peer.endpoints.first?.port)
            advertiser.signal(SIGINT)
            #expect(try await advertiser.waitForExit() == 0)
        }
    }

    @Test(
        "python-zeroconf (bound to 127.0.0.1, IPv4 only) resolves us with the right properties", .timeLimit(.minutes(1)),
        .enabled(if: TestHost.pythonHasZeroconf || TestHost.daemonsRequired, "\(TestHost.python) cannot import zeroconf (Hardware/setup.sh --tests installs it)"))
    func pythonZeroconfSeesTXT() async throws {
        let python = try #require(TestHost.pythonPath, "\(TestHost.python) not found")
        #expect(TestHost.pythonHasZeroconf, "\(python) cannot import zeroconf")
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("z")
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Zoë", "--service", service, "--info", "color=blue", "--info", "eq=a=b"])
            try await advertiser.waitForLine(containing: "Published as")
            let peer = try #require(try await scanPeers(service: service).first)

            let directory = TestHost.temporaryDirectory("peerlink-zeroconf")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let script = directory + "/resolve.py"
            try Self.zeroconfScript.write(toFile: script, atomically: true, encoding: .utf8)
            let result = try await runCommand(python, [script, "_\(service)._tcp.local.", "8"], timeout: .seconds(30))
            #expect(result.status == 0, "stderr:\n\(result.stderr)")
            let resolved = try JSONDecoder().decode([ZeroconfService].self, from: Data(result.stdout.utf8))
            #expect(resolved.count == 1, "\(resolved)")
            let service0 = try #require(resolved.first)
            #expect(service0.name == "Zoë._\(service)._tcp.local.")
            #expect(service0.port == peer.endpoints.first?.port)
            #expect(service0.addresses.contains("127.0.0.1"), "\(service0.addresses)")
            #expect(service0.properties == ["plv": "1", "plid": peer.id, "plname": "Zoë", "color": "blue", "eq": "a=b"])
            advertiser.signal(SIGINT)
            #expect(try await advertiser.waitForExit() == 0)
        }
    }

    struct ZeroconfService: Decodable, Sendable {
        var name: String
        var port: Int
        var addresses: [String]
        var properties: [String: String?]
    }

    /// Browses one type for up to N seconds with a Zeroconf bound to 127.0.0.1 (IPv4 only: no
    /// multicast leaves the machine), resolves what it found and prints it as JSON.
    static let zeroconfScript = #"""
        import json, sys, time
        from zeroconf import IPVersion, ServiceBrowser, ServiceListener, Zeroconf

        service_type, seconds = sys.argv[1], float(sys.argv[2])
        zc = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        names = []

        class Listener(ServiceListener):
            def add_service(self, zc, type_, name):
                if name not in names:
                    names.append(name)
            def update_service(self, zc, type_, name):
                pass
            def remove_service(self, zc, type_, name):
                pass

        browser = ServiceBrowser(zc, service_type, Listener())
        found = []
        try:
            deadline = time.time() + seconds
            while time.time() < deadline and not names:
                time.sleep(0.1)
            time.sleep(0.5)  # let a second instance show up, if there is one
            for name in list(names):
                info = zc.get_service_info(service_type, name, timeout=3000)
                if info is None:
                    continue
                properties = {k.decode("utf-8", "replace"): (None if v is None else v.decode("utf-8", "replace"))
                              for k, v in info.properties.items()}
                found.append({"name": name, "port": info.port, "addresses": info.parsed_addresses(),
                              "properties": properties})
        finally:
            browser.cancel()
            zc.close()
        print(json.dumps(found))
        """#

    @Test("a service avahi-publish publishes with a valid PeerLink TXT record is found by our scan", .timeLimit(.minutes(1)))
    func foreignPublisherFound() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("p")
            // Our browser reports a peer only once its port accepts a connection.
            let listener = try TCPListener()
            let id = TestHost.randomFingerprint()
            let publisher = try await Self.publish("Pub", service: service, port: listener.port, txt: ["plv=1", "plid=\(id)", "plname=Pub", "k=v"])
            defer { publisher.terminate() }

            let peers = try await scanUntil(service: service, within: .seconds(10)) { !$0.isEmpty }
            #expect(peers.count == 1)
            let peer = try #require(peers.first)
            #expect(peer.name == "Pub")
            #expect(peer.id == id)
            #expect(peer.info == ["k": "v"])
            #expect(peer.endpoints.map(\.port) == [Int(listener.port)])
            listener.close()
        }
    }

    @Test("foreign records that are not PeerLink's (no plid, bad fingerprint, bad name, bad version) are ignored", .timeLimit(.minutes(1)))
    func malformedRecordsIgnored() async throws {
        try await withSharedAvahi {
            let service = TestHost.uniqueServiceType("m")
            let listener = try TCPListener()
            let port = listener.port
            let good = TestHost.randomFingerprint()
            let records: [(name: String, txt: [String])] = [
                ("Good", ["plv=1", "plid=\(good)", "plname=Good"]),
                ("NoId", ["plv=1", "plname=NoId"]),
                ("BadFp", ["plv=1", "plid=not-a-fingerprint!", "plname=BadFp"]),
                ("ShortFp", ["plv=1", "plid=abcdefghijklmno", "plname=ShortFp"]),
                ("BadName", ["plv=1", "plid=\(TestHost.randomFingerprint())", "plname="]),
                ("LongName", ["plv=1", "plid=\(TestHost.randomFingerprint())", "plname=" + String(repeating: "n", count: 64)]),
                ("BadVersion", ["plv=x", "plid=\(TestHost.randomFingerprint())", "plname=BadVersion"]),
                ("NoTXT", []),
            ]
            var publishers: [ChildProcess] = []
            defer { for publisher in publishers { publisher.terminate() } }
            for record in records {
                publishers.append(try Self.startPublishing(record.name, service: service, port: port, txt: record.txt))
            }
            for (publisher, record) in zip(publishers, records) {
                try await publisher.waitForStderrLine(containing: "Established under name '\(record.name)'", timeout: .seconds(10))
            }

            // All of them are on the network...
            let browsed = try await AvahiBrowse.services(service)
            #expect(browsed.count == publishers.count, "\(browsed.map(\.name))")
            // ...and only the valid one is a peer.
            let peers = try await scanPeers(service: service, timeout: 3)
            #expect(peers.map(\.name) == ["Good"])
            #expect(peers.map(\.id) == [good])
            listener.close()
        }
    }
}
