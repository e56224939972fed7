import Foundation
import Testing

/// One way to get the command line wrong, and the words of the rule the error must name.
struct InvalidInput: Sendable, CustomTestStringConvertible {
    var arguments: [String]
    var rule: String
    var label: String

    init(_ label: String, _ arguments: [String], rule: String) {
        self.label = label
        self.arguments = arguments
        self.rule = rule
    }

    var testDescription: String { label }

    static let all: [InvalidInput] = [
        InvalidInput("--service Chat", ["advertise", "--name", "A", "--service", "Chat"], rule: "only lowercase ASCII letters, digits and hyphens"),
        InvalidInput("scan --service Chat", ["scan", "--lan", "--service", "Chat"], rule: "only lowercase ASCII letters, digits and hyphens"),
        InvalidInput("chat --service _peerlink._tcp", ["chat", "--name", "A", "--service", "_peerlink._tcp"], rule: "give the name alone, 'peerlink'"),
        InvalidInput("--service a--b", ["advertise", "--name", "A", "--service", "a--b"], rule: "two hyphens in a row"),
        InvalidInput("--service -x", ["advertise", "--name", "A", "--service", "-x"], rule: "starts or ends with a hyphen"),
        InvalidInput("--service=-x", ["advertise", "--name", "A", "--service=-x"], rule: "starts or ends with a hyphen"),
        InvalidInput("--service x-", ["advertise", "--name", "A", "--service", "x-"], rule: "starts or ends with a hyphen"),
        InvalidInput("--service 123", ["advertise", "--name", "A", "--service", "123"], rule: "has no letter"),
        InvalidInput("--service of 16 characters", ["advertise", "--name", "A", "--service", "abcdefghijklmnop"], rule: "16 characters long: it must be 1 to 15 characters"),
        InvalidInput("--name of 64 bytes", ["advertise", "--name", String(repeating: "n", count: 64), "--service", "chat"], rule: "64 bytes long: it must be 1 to 63 bytes"),
        InvalidInput("--name of 32 two-byte characters (64 bytes)", ["advertise", "--name", String(repeating: "é", count: 32), "--service", "chat"], rule: "64 bytes long: it must be 1 to 63 bytes"),
        InvalidInput("--name \"\"", ["advertise", "--name", "", "--service", "chat"], rule: "display name is empty"),
        InvalidInput("--info novalue", ["advertise", "--name", "A", "--info", "novalue"], rule: "is not KEY=VALUE"),
        InvalidInput("--info =value", ["advertise", "--name", "A", "--info", "=value"], rule: "empty key"),
        InvalidInput("--info plid=x (reserved)", ["advertise", "--name", "A", "--info", "plid=x"], rule: "reserved by PeerLink"),
        InvalidInput("--info PLNAME=x (reserved, any case)", ["advertise", "--name", "A", "--info", "PLNAME=x"], rule: "reserved by PeerLink"),
        InvalidInput("--info entry of 256 bytes", ["advertise", "--name", "A", "--info", "k=" + String(repeating: "v", count: 254)], rule: "each entry must be at most 255 bytes"),
        InvalidInput("--info set over 400 bytes", ["advertise", "--name", "A"] + (1...3).flatMap { ["--info", "k\($0)=" + String(repeating: "v", count: 150)] }, rule: "at most 400 bytes"),
        InvalidInput("scan --timeout 0", ["scan", "--lan", "--timeout", "0"], rule: "--timeout must be more than 0"),
        InvalidInput("scan --timeout -1", ["scan", "--lan", "--timeout=-1"], rule: "--timeout must be more than 0"),
        InvalidInput("chat --port 70000", ["chat", "--name", "A", "--port", "70000"], rule: "--port must be 1 to 65535, not 70000"),
        InvalidInput("chat --port 0", ["chat", "--name", "A", "--port", "0"], rule: "--port must be 1 to 65535, not 0"),
    ]
}

@Suite("the peerlink command line, as a user sees it")
struct CLITests {
    @Test("invalid input: exit 64 and the message names the rule", .timeLimit(.minutes(1)), arguments: InvalidInput.all)
    func invalidInput(_ input: InvalidInput) async throws {
        let configHome = TestHost.temporaryDirectory()
        let result = try await runPeerlink(input.arguments, configHome: configHome, timeout: .seconds(20))
        #expect(result.status == 64, "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains(input.rule), "stderr should name the rule (\"\(input.rule)\"):\n\(result.stderr)")
        #expect(!FileManager.default.fileExists(atPath: configHome + "/peerlink/identity.json"), "invalid input must not create an identity")
    }

    @Test("--help lists the commands and the exit codes", .timeLimit(.minutes(1)))
    func help() async throws {
        let result = try await runPeerlink(["--help"])
        #expect(result.status == 0)
        for command in ["radios", "advertise", "scan"] {
            #expect(result.stdout.contains(command), "no \(command) in:\n\(result.stdout)")
        }
        #expect(result.stdout.contains("Exit codes"))
        for code in ["0 ", "1 ", "64 ", "69 "] {
            #expect(result.stdout.split(separator: "\n").contains { $0.trimmingCharacters(in: .whitespaces).hasPrefix(code) }, "exit code \(code)not listed:\n\(result.stdout)")
        }
    }

    @Test("radios: exit 0 and a clear word about Bluetooth on a kernel without it", .timeLimit(.minutes(1)))
    func radios() async throws {
        try await withSharedAvahi {
            let result = try await runPeerlink(["radios"])
            #expect(result.status == 0, "stderr:\n\(result.stderr)")
            #expect(result.stdout.contains("lo"))
            if !TestHost.kernelHasBluetooth {
                #expect(result.stdout.split(separator: "\n").contains { $0.contains("no Bluetooth support") }, "stdout:\n\(result.stdout)")
            }
        }
    }

    @Test("radios --json: interfaces (lo with 127.0.0.1), avahi, bluetooth", .timeLimit(.minutes(1)))
    func radiosJSON() async throws {
        try await withSharedAvahi {
            let result = try await runPeerlink(["radios", "--json"])
            #expect(result.status == 0, "stderr:\n\(result.stderr)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "not a JSON object:\n\(result.stdout)")
            #expect(Set(object.keys).isSuperset(of: ["interfaces", "avahi", "bluetooth"]), "keys: \(object.keys.sorted())")
            let interfaces = try #require(object["interfaces"] as? [[String: Any]])
            let lo = try #require(interfaces.first { $0["name"] as? String == "lo" }, "no lo in \(interfaces)")
            let addresses = lo["addresses"] as? [String] ?? []
            #expect(addresses.contains { $0 == "127.0.0.1" || $0.hasPrefix("127.0.0.1/") }, "lo addresses: \(addresses)")
            let avahi = try #require(object["avahi"] as? [String: Any])
            #expect(avahi["running"] is Bool)
            let bluetooth = try #require(object["bluetooth"] as? [String: Any])
            if !TestHost.kernelHasBluetooth {
                #expect(bluetooth["available"] as? Bool == false)
                #expect((bluetooth["problem"] as? String)?.contains("no Bluetooth support") == true, "\(bluetooth)")
            }
        }
    }

    @Test(
        "scan --bluetooth on a kernel without Bluetooth: exit 69 and a clear message", .timeLimit(.minutes(1)),
        .enabled(if: !TestHost.kernelHasBluetooth, "this kernel has Bluetooth sockets; the no-Bluetooth message cannot be checked here"))
    func scanBluetoothWithoutBluetooth() async throws {
        let result = try await runPeerlink(["scan", "--bluetooth", "--timeout", "1"])
        #expect(result.status == 69, "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains("no Bluetooth support"), "stderr:\n\(result.stderr)")
        #expect(result.stdout.isEmpty)
    }
}

@Suite("identity files")
struct IdentityFileTests {
    private static func mode(_ path: String) throws -> Int {
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
    }

    @Test(
        "--identity PATH: created with mode 0600, the same id on the next run", .timeLimit(.minutes(1)),
        .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
    func createdThenReused() async throws {
        try await withSharedAvahi {
            let directory = TestHost.temporaryDirectory("peerlink-identity") + "/x"
            let path = directory + "/id.json"
            let service = TestHost.uniqueServiceType("i")

            let first = try ChildProcess.peerlink(["advertise", "--name", "Idem", "--service", service, "--identity", path])
            try await first.waitForLine(containing: "Published as")
            let firstID = try await first.advertisedID()
            #expect(first.stderr.contains("created a new identity in \(path)"), "stderr:\n\(first.stderr)")
            let fileMode = try Self.mode(path)
            let directoryMode = try Self.mode(directory)
            #expect(fileMode == 0o600, "identity file mode \(String(fileMode, radix: 8))")
            #expect(directoryMode & 0o077 == 0, "a directory created for the identity is private, mode \(String(directoryMode, radix: 8))")
            #expect(try await scanPeers(service: service).map(\.id) == [firstID])
            first.signal(SIGINT)
            #expect(try await first.waitForExit() == 0)
            let contents = try Data(contentsOf: URL(fileURLWithPath: path))

            let second = try ChildProcess.peerlink(["advertise", "--name", "Idem", "--service", service, "--identity", path])
            try await second.waitForLine(containing: "Published as")
            #expect(try await second.advertisedID() == firstID)
            #expect(!second.stderr.contains("created"), "stderr:\n\(second.stderr)")
            #expect(try await scanUntil(service: service) { $0.count == 1 }.map(\.id) == [firstID])
            second.signal(SIGINT)
            #expect(try await second.waitForExit() == 0)
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == contents, "reusing an identity never rewrites it")
        }
    }

    @Test(
        "the default identity is $XDG_CONFIG_HOME/peerlink/identity.json, mode 0600", .timeLimit(.minutes(1)),
        .enabled(if: TestHost.avahiTestsEnabled, "avahi-daemon is not running (Hardware/test.sh starts one restricted to lo)"))
    func defaultLocation() async throws {
        try await withSharedAvahi {
            let configHome = TestHost.temporaryDirectory()
            let advertiser = try ChildProcess.peerlink(["advertise", "--name", "Home", "--service", TestHost.uniqueServiceType("i")], configHome: configHome)
            try await advertiser.waitForLine(containing: "Published as")
            let path = configHome + "/peerlink/identity.json"
            #expect(try Self.mode(path) == 0o600)
            advertiser.signal(SIGINT)
            #expect(try await advertiser.waitForExit() == 0)
        }
    }

    @Test("a corrupt identity file: exit 64, the message names the file and says corrupt, the file is untouched", .timeLimit(.minutes(1)))
    func corrupt() async throws {
        let directory = TestHost.temporaryDirectory("peerlink-identity")
        let path = directory + "/id.json"
        var garbage = Data((0..<200).map { _ in UInt8.random(in: 0...255) })
        garbage.append(contentsOf: [0xFF, 0xFE, 0x00, 0x7B])
        try garbage.write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        let before = try FileManager.default.attributesOfItem(atPath: path)

        let result = try await runPeerlink(["advertise", "--name", "Broken", "--service", TestHost.uniqueServiceType(), "--identity", path], timeout: .seconds(15))
        #expect(result.status == 64, "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains(path), "stderr:\n\(result.stderr)")
        #expect(result.stderr.contains("corrupt"), "stderr:\n\(result.stderr)")

        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage, "the corrupt file must be left as it was")
        let after = try FileManager.default.attributesOfItem(atPath: path)
        #expect(after[.modificationDate] as? Date == before[.modificationDate] as? Date)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["id.json"], "no stray files next to it")
    }
}
