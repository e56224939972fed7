import Foundation
import PeerLinkCore
import Testing

@Suite("Resource limits")
struct ResourceLimitsTests {
    @Test("the defaults are valid and are the documented ones")
    func defaults() throws {
        let limits = ResourceLimits.default
        try limits.validate()
        #expect(limits.maximumHandshakingLinks == 64)
        #expect(limits.maximumHandshakingLinksPerAddress == 8)
        #expect(limits.maximumLinks == 128)
        #expect(limits.maximumLinksPerAddress == 32)
        #expect(limits.writeProgressTimeout == .seconds(15))
        #expect(limits.maximumPartialMessageBytesPerLink == 32 << 20)
        #expect(limits.maximumPartialMessageBytesPerSession == 64 << 20)
        #expect(limits.maximumReasonBytes == 256)
        #expect(limits.maximumKnownPeers == 1024)
        #expect(limits.reservedDescriptors == 32)
        #expect(limits.acceptBackoff == .milliseconds(10) ... .seconds(1))
        #expect(LinkPolicy.default.limits == limits)
    }

    /// One out-of-range change each, and a word the error must name.
    static let invalid: [(String, @Sendable (inout ResourceLimits) -> Void, String)] = [
        ("no links", { $0.maximumLinks = 0 }, "maximumLinks"),
        ("more in handshake than in all", { $0.maximumHandshakingLinks = 129 }, "maximumHandshakingLinks"),
        ("per address over the handshake cap", { $0.maximumHandshakingLinksPerAddress = 65 }, "PerAddress"),
        ("links per address over the cap", { $0.maximumLinksPerAddress = 0 }, "maximumLinksPerAddress"),
        ("zero write timeout", { $0.writeProgressTimeout = .zero }, "writeProgressTimeout"),
        ("partial bytes under one message", { $0.maximumPartialMessageBytesPerLink = 1 << 20 }, "one whole message"),
        ("session under link", { $0.maximumPartialMessageBytesPerSession = 16 << 20 }, "PerSession"),
        ("tiny reasons", { $0.maximumReasonBytes = 3 }, "maximumReasonBytes"),
        ("huge reasons", { $0.maximumReasonBytes = 100_000 }, "maximumReasonBytes"),
        ("no known peers", { $0.maximumKnownPeers = 0 }, "maximumKnownPeers"),
        ("negative reserve", { $0.reservedDescriptors = -1 }, "reservedDescriptors"),
        ("no backoff", { $0.acceptBackoff = .zero ... .seconds(1) }, "acceptBackoff"),
    ]

    @Test("out-of-range limits are refused, naming the limit", arguments: 0..<invalid.count)
    func invalidLimits(index: Int) {
        let (name, change, word) = Self.invalid[index]
        var limits = ResourceLimits.default
        change(&limits)
        let error = #expect(throws: PeerLinkError.self, "\(name)") { try limits.validate() }
        #expect(error?.code == .invalidParameter)
        #expect(error?.message.contains(word) == true, "\(name): \(error?.message ?? "")")
    }

    @Test("link caps fitted to a descriptor limit stay valid and below it")
    func fitted() throws {
        for limit in [0, 16, 64, 128, 256, 1024, 4096, 1 << 20] {
            let fitted = ResourceLimits.default.fitted(toDescriptorLimit: limit)
            try fitted.validate()
            if limit >= 64 {
                #expect(fitted.maximumLinks + fitted.reservedDescriptors <= limit, "\(limit)")
            }
            #expect(fitted.maximumLinks <= ResourceLimits.default.maximumLinks)
        }
        #expect(ResourceLimits.default.fitted(toDescriptorLimit: 1024) == .default)
        let small = ResourceLimits.default.fitted(toDescriptorLimit: 128)
        #expect(small.maximumLinks == 48 && small.maximumHandshakingLinks == 24)
    }
}

@Suite("Peer text: what a peer says is safe to print")
struct PeerTextTests {
    static let cases: [(String, String)] = [
        ("plain words stay", "plain words stay"),
        ("\u{1B}[2J\u{1B}[Hcleared", "\\u{1B}[2J\\u{1B}[Hcleared"),
        ("\u{1B}]0;owned\u{07}title", "\\u{1B}]0;owned\\u{7}title"),
        ("\u{1B}]8;;http://x\u{1B}\\link", "\\u{1B}]8;;http://x\\u{1B}\\\\link"),
        ("line\r* mallory joined", "line\\r* mallory joined"),
        ("two\nlines\ttab", "two\\nlines\\ttab"),
        ("c1 \u{9B}31m csi", "c1 \\u{9B}31m csi"),
        ("\u{85}next line", "\\u{85}next line"),
        ("abc\u{202E}fdp.exe", "abc\\u{202E}fdp.exe"),
        ("\u{2066}iso\u{2069} \u{200F}rlm \u{061C}", "\\u{2066}iso\\u{2069} \\u{200F}rlm \\u{61C}"),
        ("sep\u{2028}\u{2029}", "sep\\u{2028}\\u{2029}"),
        ("nul\u{0}del\u{7F}", "nul\\u{0}del\\u{7F}"),
        ("back\\slash", "back\\\\slash"),
        ("é ✓ 日本 👩‍💻", "é ✓ 日本 👩‍💻"),
    ]

    @Test("control characters, escape sequences and direction overrides are escaped", arguments: 0..<cases.count)
    func escapes(index: Int) {
        let (input, expected) = Self.cases[index]
        #expect(PeerText.sanitized(input, limit: 1000) == expected)
    }

    @Test("the result never holds a character that needs escaping, and keeps to the limit")
    func invariants() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let bytes = (0..<Int.random(in: 0...300, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let limit = Int.random(in: 0...200, using: &generator)
            let text = PeerText.sanitized(bytes: bytes, limit: limit)
            #expect(text.utf8.count <= limit)
            #expect(!text.unicodeScalars.contains { PeerText.needsEscape($0) && $0 != "\\" })
        }
    }

    @Test("cutting keeps to the limit with an ellipsis, at a scalar")
    func cutting() {
        #expect(PeerText.sanitized("abcdef", limit: 6) == "abcdef")
        #expect(PeerText.sanitized("abcdefg", limit: 6) == "abc…")
        #expect(PeerText.sanitized("ééééé", limit: 8) == "éé…")
        #expect(PeerText.sanitized("\u{1B}\u{1B}", limit: 8) == "\\u{1B…")
        #expect(PeerText.sanitized("abc", limit: 2) == "")
        #expect(PeerText.cut("abc", limit: 3) == "abc")
        #expect(PeerText.sanitized(bytes: [UInt8](repeating: 0x41, count: 100_000), limit: 10) == "AAAAAAA…")
    }
}

@Suite("Terminal injection before authentication")
struct TerminalInjectionTests {
    static func listener(limits: ResourceLimits = .default) -> LinkStateMachine {
        LinkStateMachine(
            role: .listener, identity: .generate(), preface: WireFixture.preface(), hello: WireFixture.hello("Bo"),
            policy: LinkPolicy(limits: limits))
    }

    @Test("a refusing verdict's reason arrives escaped and cut to the limit")
    func refusingVerdict() throws {
        var link = Self.listener()
        _ = link.start(at: .zero)
        let hostile = "\r* mallory joined\n\u{1B}]0;pwned\u{07}\u{1B}[2J\u{9B}1m\u{202E}" + String(repeating: "x", count: 60_000)
        let bytes = WireFixture.preface().encoded() + Verdict.refuse(code: .sessionFull, reason: hostile).encoded()
        let closure = try #require(link.receive(bytes, at: .zero).closure)
        #expect(closure.byPeer && closure.code == .sessionFull)
        #expect(closure.reason.hasPrefix("\\r* mallory joined\\n\\u{1B}]0;pwned\\u{7}\\u{1B}[2J\\u{9B}1m\\u{202E}xxx"))
        #expect(closure.reason.hasSuffix(PeerText.ellipsis))
        #expect(closure.reason.utf8.count <= ResourceLimits.default.maximumReasonBytes)
        #expect(!closure.reason.unicodeScalars.contains { $0.properties.generalCategory == .control })
    }

    @Test("the cut length follows the limits")
    func configuredLength() throws {
        var limits = ResourceLimits.default
        limits.maximumReasonBytes = 16
        var link = Self.listener(limits: limits)
        _ = link.start(at: .zero)
        let bytes = WireFixture.preface().encoded() + Verdict.refuse(code: .protocolError, reason: String(repeating: "y", count: 100)).encoded()
        let closure = try #require(link.receive(bytes, at: .zero).closure)
        #expect(closure.reason == String(repeating: "y", count: 13) + PeerText.ellipsis)
    }

    @Test("a GO_AWAY reason and a resource reason are escaped when decoded")
    func decodedReasons() throws {
        guard case .goAway(_, let reason) = try Frame.decode(Frame.goAway(code: .normal, reason: "bye\u{1B}[31m").encoded()) else {
            Issue.record("not a GO_AWAY")
            return
        }
        #expect(reason == "bye\\u{1B}[31m")
        var decoder = ResourceMessageDecoder()
        decoder.append(try ResourceMessage.decline(reason: "no\r\u{1B}]52;c;AAAA\u{07}").encoded())
        #expect(try decoder.next() == .decline(reason: "no\\r\\u{1B}]52;c;AAAA\\u{7}"))
    }
}

@Suite("Link admission: the link caps")
struct LinkAdmissionTests {
    static var limits: ResourceLimits {
        ResourceLimits(maximumHandshakingLinks: 4, maximumHandshakingLinksPerAddress: 2, maximumLinks: 6, maximumLinksPerAddress: 4)
    }

    @Test("links from one address beyond its caps are refused")
    func perAddress() {
        var admission = LinkAdmission<Int>()
        #expect(admission.admit(1, from: "10.0.0.9", limits: Self.limits, at: .zero).verdict == .admit)
        #expect(admission.admit(2, from: "10.0.0.9", limits: Self.limits, at: .zero).verdict == .admit)
        let third = admission.admit(3, from: "10.0.0.9", limits: Self.limits, at: .zero)
        #expect(third.verdict == .refuse(reason: "too many links from 10.0.0.9 in their handshake (2)"))
        #expect(third.logSummary == LinkAdmission<Int>.Usage(links: 2, handshaking: 2, refused: 1))
        // Established links count towards the address's total only.
        admission.established(1)
        admission.established(2)
        #expect(admission.admit(3, from: "10.0.0.9", limits: Self.limits, at: .zero).verdict == .admit)
        #expect(admission.admit(4, from: "10.0.0.9", limits: Self.limits, at: .zero).verdict == .admit)
        admission.established(3)
        admission.established(4)
        #expect(admission.admit(5, from: "10.0.0.9", limits: Self.limits, at: .zero).verdict == .refuse(reason: "too many links from 10.0.0.9 (4)"))
        // Another address is not affected.
        #expect(admission.admit(6, from: "10.0.0.8", limits: Self.limits, at: .zero).verdict == .admit)
        #expect(admission.usage == LinkAdmission<Int>.Usage(links: 5, handshaking: 1, refused: 2))
    }

    @Test("at the handshake cap the oldest incoming handshake of the busiest address makes room")
    func eviction() {
        var admission = LinkAdmission<Int>()
        admission.opened(100, from: "10.0.0.1")  // a dial: never evicted
        #expect(admission.admit(1, from: "10.0.0.2", limits: Self.limits, at: .zero).verdict == .admit)
        #expect(admission.admit(2, from: "10.0.0.3", limits: Self.limits, at: .zero).verdict == .admit)
        #expect(admission.admit(3, from: "10.0.0.3", limits: Self.limits, at: .zero).verdict == .admit)
        // Four in their handshake: the next evicts the oldest of 10.0.0.3, which holds two.
        #expect(admission.admit(4, from: "10.0.0.4", limits: Self.limits, at: .zero).verdict == .admitEvicting(2))
        #expect(!admission.contains(2))
        #expect(admission.usage.handshaking == 4 && admission.usage.evicted == 1)
        // Once links are established, the total cap refuses when nothing is in its handshake.
        for key in [100, 1, 3, 4] { admission.established(key) }
        #expect(admission.admit(5, from: "10.0.0.5", limits: Self.limits, at: .zero).verdict == .admit)
        admission.established(5)
        #expect(admission.admit(6, from: "10.0.0.6", limits: Self.limits, at: .zero).verdict == .admit)
        admission.established(6)
        #expect(admission.admit(7, from: "10.0.0.7", limits: Self.limits, at: .zero).verdict == .refuse(reason: "too many links (6)"))
        admission.removed(6)
        #expect(admission.admit(7, from: "10.0.0.7", limits: Self.limits, at: .zero).verdict == .admit)
    }

    @Test("a dial at the handshake cap makes room by evicting the oldest incoming handshake, never another dial")
    func dialAtTheCap() {
        var admission = LinkAdmission<Int>()
        for key in 1...4 {
            #expect(admission.admit(key, from: "10.0.0.\(key)", limits: Self.limits, at: .zero).verdict == .admit)
        }
        #expect(admission.usage.handshaking == 4)
        // the session's own dial: in, and the oldest stranger out
        let evicted = admission.opened(100, from: "10.0.0.9", limits: Self.limits)
        #expect(evicted == 1)
        #expect(!admission.contains(1) && admission.contains(100))
        #expect(admission.usage.handshaking == 4 && admission.usage.evicted == 1)
        // with only dials left in their handshake, nothing can make room: the dial stays
        var dials = LinkAdmission<Int>()
        for key in 1...5 {
            let evicted = dials.opened(key, from: nil, limits: Self.limits)
            #expect(evicted == nil)
        }
        #expect(dials.usage.handshaking == 5)
    }

    @Test("refusals are summarised at most every 10 s")
    func summaries() {
        var admission = LinkAdmission<Int>()
        var limits = Self.limits
        limits.maximumLinks = 1
        limits.maximumHandshakingLinks = 1
        limits.maximumHandshakingLinksPerAddress = 1
        limits.maximumLinksPerAddress = 1
        _ = admission.admit(0, from: "10.0.0.1", limits: limits, at: .zero)
        admission.established(0)
        var summaries: [LinkAdmission<Int>.Usage] = []
        for second in 0..<25 {
            for index in 0..<10 {
                let decision = admission.admit(1000 + second * 10 + index, from: "10.0.0.2", limits: limits, at: .seconds(second))
                #expect(decision.verdict != .admit)
                if let summary = decision.logSummary { summaries.append(summary) }
            }
        }
        #expect(summaries.map(\.refused) == [1, 100, 100])
        #expect(admission.usage.refused == 250)
    }

    @Test("where a link comes from", arguments: [
        ("tcp://127.0.0.2:4000", "127.0.0.2"), ("tcp://[::1]:4000", "::1"), ("bt://00:AA:01:00:00:00/l2cap/0x1001", "00:AA:01:00:00:00"),
        ("bt://00:AA:01:00:00:00/rfcomm/3", "00:AA:01:00:00:00"), ("memory://victim/dialer-3", nil), ("tcp://(unknown peer)", nil),
    ])
    func origins(description: String, origin: String?) {
        #expect(LinkAdmission<Int>.origin(ofRemote: description) == origin)
    }
}
