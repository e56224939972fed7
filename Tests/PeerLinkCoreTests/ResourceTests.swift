import Crypto
import PeerLinkCore
import Testing

@Suite("Resource names: what a peer offers, made safe to create")
struct ResourceNameTests {
    @Test(arguments: [
        ("report.pdf", "report.pdf"),
        ("Zoë's café.txt", "Zoë's café.txt"),
        ("李小龍.png", "李小龍.png"),
        ("../../etc/passwd", "passwd"),
        ("/etc/shadow", "shadow"),
        ("a/b/c.txt", "c.txt"),
        ("dir/", "dir"),
        ("..\\..\\windows\\win.ini", "win.ini"),
        ("..", ResourceName.fallback),
        (".", ResourceName.fallback),
        ("...", ResourceName.fallback),
        ("", ResourceName.fallback),
        ("/", ResourceName.fallback),
        ("../", ResourceName.fallback),
        (".bashrc", "bashrc"),
        ("..hidden.txt", "hidden.txt"),
        ("  spaced  ", "spaced"),
        ("bell\u{07}.txt", "bell_.txt"),
        ("nul\u{00}byte", "nul_byte"),
        ("line\nbreak", "line_break"),
        ("esc\u{1B}[31mred", "esc_[31mred"),
        ("del\u{7F}", "del_"),
        ("c1\u{85}", "c1_"),
        ("gpj.\u{202E}exe", "gpj._exe"),  // a right-to-left override hides the real extension
        ("zero\u{200B}width", "zero_width"),
        // a separator followed by a combining mark is one Character, and still separates (found by fuzzing)
        ("x/\u{1BAA}", "\u{1BAA}"),
        ("../\u{301}etc/passwd\u{301}", "passwd\u{301}"),
        ("/\u{301}/", "\u{301}"),
    ])
    func sanitizes(_ offered: String, _ expected: String) {
        #expect(ResourceName.sanitized(offered) == expected)
    }

    @Test func longNamesAreCutOnACharacterBoundaryKeepingTheExtension() {
        let long = String(repeating: "€", count: 200) + ".tar"
        let safe = ResourceName.sanitized(long)
        #expect(safe.utf8.count <= ResourceName.maximumBytes)
        #expect(safe.utf8.count > ResourceName.maximumBytes - 3)
        #expect(safe.hasSuffix(".tar"))
        #expect(safe.dropLast(4).allSatisfy { $0 == "€" })

        let noExtension = String(repeating: "a", count: 300)
        #expect(ResourceName.sanitized(noExtension) == String(repeating: "a", count: 255))

        let longExtension = "x." + String(repeating: "e", count: 300)
        #expect(ResourceName.sanitized(longExtension).utf8.count <= ResourceName.maximumBytes)
    }

    @Test func everySanitizedNameIsSafe() {
        var generator = SeededGenerator(seed: 5)
        let alphabet: [Character] = ["a", ".", "/", "\\", "\u{00}", "\n", "\u{1B}", "é", "😀", " ", "\u{202E}", "-"]
        for _ in 0..<2000 {
            let length = Int.random(in: 0...300, using: &generator)
            let name = String((0..<length).map { _ in alphabet.randomElement(using: &generator)! })
            let safe = ResourceName.sanitized(name)
            #expect(!safe.isEmpty && safe != "." && safe != "..")
            #expect(!safe.hasPrefix("."))
            #expect(!safe.contains("/") && !safe.contains("\\"))
            #expect(safe.utf8.count <= ResourceName.maximumBytes)
            #expect(!safe.unicodeScalars.contains { $0.properties.generalCategory == .control || $0.properties.generalCategory == .format })
            #expect(ResourceName.sanitized(safe) == safe, "sanitising is idempotent")
        }
    }

    @Test func alternativesNumberTheStem() {
        #expect(ResourceName.alternative(to: "report.pdf", number: 1) == "report (1).pdf")
        #expect(ResourceName.alternative(to: "README", number: 12) == "README (12)")
        #expect(ResourceName.alternative(to: "archive.tar.gz", number: 2) == "archive.tar (2).gz")
        let long = String(repeating: "a", count: 255)
        let alternative = ResourceName.alternative(to: long, number: 3)
        #expect(alternative.utf8.count == 255)
        #expect(alternative.hasSuffix(" (3)"))
    }
}

@Suite("Resource messages: encode, decode at every split, reject what is malformed")
struct ResourceMessageTests {
    static let offer = ResourceOffer(
        transferID: try! TransferID(bytes: Array(0..<16)), name: "photo €.jpg", size: 104_857_600,
        sha256: Array(SHA256.hash(data: [1, 2, 3])))

    static let all: [ResourceMessage] = [
        .offer(offer), .accept(offset: 0), .accept(offset: 52_428_800), .decline(reason: "not now"),
        .data([]), .data(Array(repeating: 0xAB, count: ResourceProtocol.chunkBytes)), .verdict(.verified),
        .verdict(.checksumMismatch), .verdict(.error("the disk is full")), .cancel(reason: "user cancelled"),
    ]

    @Test func roundTripsEveryMessageAtEverySplit() throws {
        let stream = try Self.all.flatMap { try $0.encoded() }
        for split in [1, 2, 3, 5, 7, 64, 1000, stream.count] {
            var decoder = ResourceMessageDecoder()
            var decoded: [ResourceMessage] = []
            var index = 0
            while index < stream.count {
                decoder.append(Array(stream[index..<min(index + split, stream.count)]))
                index += split
                while let message = try decoder.next() { decoded.append(message) }
            }
            #expect(decoded == Self.all, "split \(split)")
            #expect(decoder.pendingBytes == 0)
        }
    }

    @Test func offerLayoutIsAsSpecified() throws {
        let bytes = try ResourceMessage.offer(Self.offer).encoded()
        let name = Array("photo €.jpg".utf8)
        #expect(bytes[0] == 1)  // OFFER
        #expect(Array(bytes[1..<5]) == UInt32(1 + 16 + 8 + 32 + 2 + name.count).bigEndianArray)
        #expect(bytes[5] == ResourceProtocol.version)
        #expect(Array(bytes[6..<22]) == Array(0..<16))
        #expect(Array(bytes[22..<30]) == UInt64(104_857_600).bigEndianArray)
        #expect(Array(bytes[30..<62]) == Self.offer.sha256)
        #expect(Array(bytes[62..<64]) == UInt16(name.count).bigEndianArray)
        #expect(Array(bytes[64...]) == name)
        #expect(try ResourceMessage.accept(offset: 258).encoded() == [2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 2])
    }

    @Test(arguments: [
        ([9, 0, 0, 0, 0], "unknown message type 9"),
        ([2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 1], "a truncated accept"),
        ([2, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 7], "1 bytes after"),
        ([5, 0, 0, 0, 1, 3], "an unknown verdict 3"),
        ([4, 0, 0x10, 0, 0], "over the limit"),
        ([1, 0, 0, 0, 3, 1, 0, 0], "a truncated offer"),
        ([3, 0, 0, 0, 3, 0, 5, 65], "a truncated reason"),
    ] as [([UInt8], String)])
    func rejectsMalformed(_ bytes: [UInt8], _ expected: String) {
        var decoder = ResourceMessageDecoder()
        decoder.append(bytes)
        #expect {
            _ = try decoder.next()
        } throws: { error in
            (error as? PeerLinkError)?.message.contains(expected) == true
        }
    }

    @Test func rejectsAnotherVersionAsUnsupported() throws {
        var bytes = try ResourceMessage.offer(Self.offer).encoded()
        bytes[5] = 2
        var decoder = ResourceMessageDecoder()
        decoder.append(bytes)
        #expect(throws: PeerLinkError.self) { _ = try decoder.next() }
        do {
            _ = try decoder.next()
        } catch {
            #expect(error.code == .unsupported)
            #expect(error.message.contains("update PeerLink"))
        }
    }

    @Test func refusesToEncodeWhatTheFormatCannotHold() {
        var offer = Self.offer
        offer.name = String(repeating: "x", count: 256)
        #expect(throws: PeerLinkError.self) { try ResourceMessage.offer(offer).encoded() }
        offer.name = ""
        #expect(throws: PeerLinkError.self) { try ResourceMessage.offer(offer).encoded() }
        offer = Self.offer
        offer.sha256 = [1, 2, 3]
        #expect(throws: PeerLinkError.self) { try ResourceMessage.offer(offer).encoded() }
        #expect(throws: PeerLinkError.self) { try ResourceMessage.data(Array(repeating: 0, count: ResourceProtocol.maximumBodyBytes + 1)).encoded() }
        #expect(throws: PeerLinkError.self) { try ResourceMessage.cancel(reason: String(repeating: "r", count: 1025)).encoded() }
    }

    @Test func derivedTransferIDsDependOnContentSizeAndName() {
        let sha = Array(SHA256.hash(data: [1]))
        let id = TransferID.derived(sha256: sha, size: 1, name: "a")
        #expect(id == TransferID.derived(sha256: sha, size: 1, name: "a"))
        #expect(id != TransferID.derived(sha256: sha, size: 2, name: "a"))
        #expect(id != TransferID.derived(sha256: sha, size: 1, name: "b"))
        #expect(id != TransferID.derived(sha256: Array(SHA256.hash(data: [2])), size: 1, name: "a"))
        #expect(id.hex.count == 32 && id.hex.allSatisfy(\.isHexDigit))
        #expect(TransferID.random() != TransferID.random())
    }
}

@Suite("Resume bookkeeping: which offset a re-offer continues at")
struct ResumeBookTests {
    static let offer = ResourceMessageTests.offer
    static let sender = Fingerprint(publicKey: Array(repeating: UInt8(7), count: 32))

    @Test func partialNamesAreHiddenAndPerSenderAndTransfer() {
        let name = ResumeBook.partialName(sender: Self.sender, transfer: Self.offer.transferID)
        #expect(name == ".peerlink-\(Self.sender.value)-000102030405060708090a0b0c0d0e0f")
        #expect(ResourceName.sanitized(name) != name, "no offered name can collide with a partial file")
        let other = Fingerprint(publicKey: Array(repeating: UInt8(8), count: 32))
        #expect(ResumeBook.partialName(sender: other, transfer: Self.offer.transferID) != name)
    }

    @Test func decisions() {
        let record = ResumeBook.record(for: Self.offer)
        #expect(ResumeBook.decide(offer: Self.offer, record: nil, partialLength: nil) == .fresh)
        #expect(ResumeBook.decide(offer: Self.offer, record: record, partialLength: 0) == .fresh)
        #expect(ResumeBook.decide(offer: Self.offer, record: record, partialLength: 4096) == .resume(at: 4096))
        #expect(ResumeBook.decide(offer: Self.offer, record: record, partialLength: Self.offer.size) == .resume(at: Self.offer.size))
        #expect(ResumeBook.decide(offer: Self.offer, record: record, partialLength: 4096).offset == 4096)

        guard case .restart(let longer) = ResumeBook.decide(offer: Self.offer, record: record, partialLength: Self.offer.size + 1)
        else { Issue.record("a partial longer than the file must restart"); return }
        #expect(longer.contains("longer"))

        var changed = Self.offer
        changed.sha256[0] ^= 1
        guard case .restart(let other) = ResumeBook.decide(offer: changed, record: record, partialLength: 10)
        else { Issue.record("another file's partial must restart"); return }
        #expect(other.contains("another version"))
        #expect(ResumeBook.decide(offer: changed, record: record, partialLength: 10).offset == 0)

        guard case .restart = ResumeBook.decide(offer: Self.offer, record: nil, partialLength: 10)
        else { Issue.record("a partial without its record must restart"); return }
        guard case .restart = ResumeBook.decide(offer: Self.offer, record: record, partialLength: nil)
        else { Issue.record("a record without its partial must restart"); return }
    }

    @Test func partialFilesAreRecognisedByName() {
        let base = ResumeBook.partialName(sender: Self.sender, transfer: Self.offer.transferID)
        #expect(ResumeBook.keptTransfer(named: base + ResumeBook.partSuffix)?.base == base)
        #expect(ResumeBook.keptTransfer(named: base + ResumeBook.metaSuffix)?.sender == Self.sender.value)
        for other in [base, "report.pdf", ".peerlink-x-y.part", base.dropLast() + ".part", ".peerlink-\(Self.sender.value)-\(String(repeating: "g", count: 32)).part",
            ".peerlink-\(Self.sender.value)-00-\(String(repeating: "0", count: 32)).meta", ".peerlink-AAAAAAAAAAAAAAAA-\(String(repeating: "0", count: 32)).part"]
        {
            #expect(ResumeBook.keptTransfer(named: other) == nil, "\(other)")
        }
    }

    @Test func keptPartialsAreBoundedPerSenderAndInAllOldestFirst() {
        func kept(_ sender: String, _ count: Int, from start: Int64) -> [ResumeBook.Kept] {
            (0..<count).map { ResumeBook.Kept(base: "\(sender)-\($0)", sender: sender, modified: start + Int64($0)) }
        }
        // One sender at its limit: the oldest goes before a new one starts.
        let mallory = kept("m", ResumeBook.keptPerSender, from: 100)
        #expect(ResumeBook.toRemove(beforeStarting: "m-new", from: "m", kept: mallory, busy: []) == ["m-0"])
        // ...unless it is being received; then the next oldest.
        #expect(ResumeBook.toRemove(beforeStarting: "m-new", from: "m", kept: mallory, busy: ["m-0"]) == ["m-1"])
        // Another sender's transfer does not count against this one's limit.
        #expect(ResumeBook.toRemove(beforeStarting: "a-new", from: "a", kept: mallory, busy: []) == [])
        // The same transfer restarting is not counted twice.
        #expect(ResumeBook.toRemove(beforeStarting: "m-3", from: "m", kept: mallory, busy: []) == [])
        // A .part and a .meta of one transfer count once, at the later of their times.
        let pair = [ResumeBook.Kept(base: "m-0", sender: "m", modified: 1_000)] + mallory
        #expect(ResumeBook.toRemove(beforeStarting: "m-new", from: "m", kept: pair, busy: []) == ["m-1"])
        // Many senders (fresh keys) together: the directory's limit, oldest first whoever sent it.
        let crowd = (0..<ResumeBook.keptInDirectory).flatMap { kept("s\($0)", 1, from: Int64($0)) }
        #expect(ResumeBook.toRemove(beforeStarting: "x-new", from: "x", kept: crowd, busy: []) == ["s0-0"])
        let over = crowd + kept("t", 3, from: 500)
        #expect(ResumeBook.toRemove(beforeStarting: "x-new", from: "x", kept: over, busy: []) == ["s0-0", "s1-0", "s2-0", "s3-0"])
    }

    @Test func senderLedgerFollowsTheReceiversAcknowledgements() throws {
        var ledger = SendLedger(size: 1000)
        #expect(try ledger.accepted(at: 0) == 0)
        #expect(try ledger.accepted(at: 640) == 640)
        #expect(ledger.acknowledged == 640)
        #expect(ledger.attempts == 2)
        #expect(throws: PeerLinkError.self) { try ledger.accepted(at: 1001) }
        #expect(ledger.acknowledged == 640)
    }
}

@Suite("Transfer progress and rate")
struct TransferProgressTests {
    @Test func fractionAndTimeLeft() {
        let progress = TransferProgress(bytesDone: 250, total: 1000, bytesPerSecond: 50)
        #expect(progress.fraction == 0.25)
        #expect(progress.secondsRemaining == 15)
        #expect(TransferProgress(bytesDone: 0, total: 0, bytesPerSecond: 0).fraction == 1)
        #expect(TransferProgress(bytesDone: 1, total: 2, bytesPerSecond: 0).secondsRemaining == nil)
    }

    @Test func rateOverASlidingWindow() {
        var meter = RateMeter(window: .seconds(2))
        #expect(meter.record(bytes: 0, at: .zero) == 0)
        #expect(meter.record(bytes: 1000, at: .seconds(1)) == 1000)
        #expect(meter.record(bytes: 3000, at: .seconds(2)) == 1500)
        // The first sample falls out of the window: the rate is that of the last 2 s.
        #expect(meter.record(bytes: 7000, at: .seconds(3)) == 3000)
        // Nothing moved in the last 2 s: a stall shows as 0.
        #expect(meter.record(bytes: 7000, at: .seconds(5)) == 0)
    }
}

extension FixedWidthInteger {
    var bigEndianArray: [UInt8] { (0..<Self.bitWidth / 8).reversed().map { UInt8(truncatingIfNeeded: self >> ($0 * 8)) } }
}
