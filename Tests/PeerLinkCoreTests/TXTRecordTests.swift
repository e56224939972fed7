import PeerLinkCore
import Testing

/// TXT strings from text (each string's UTF-8).
private func txt(_ strings: String...) -> [[UInt8]] { strings.map { Array($0.utf8) } }

/// The `plid` string of the key 0…31.
private let plid = "plid=" + KnownKeys.zeroToThirtyOneFingerprint

@Suite("TXTRecord: PeerLink's DNS-SD TXT record")
struct TXTRecordTests {
    static let fingerprint = Fingerprint(publicKey: KnownKeys.zeroToThirtyOne)

    @Test(arguments: [
        [:],
        ["color": "blue"],
        ["name": "Zoë 👩‍💻", "empty": "", "eq": "a=b=c"],
        ["Mixed Case Key": "value", "~": "tilde"],
        ["k": String(repeating: "€", count: 84)],  // k=€… is 1 + 1 + 252 = 254 bytes
    ] as [[String: String]])
    func roundTrip(_ entries: [String: String]) throws {
        let record = TXTRecord(fingerprint: Self.fingerprint, displayName: "Ana's laptop 💻", info: try DiscoveryInfo(entries))
        let decoded = try TXTRecord(decoding: record.encoded())
        #expect(decoded == record)
        #expect(decoded.version == TXTRecord.protocolVersion)
        #expect(decoded.fingerprint == Self.fingerprint)
        #expect(decoded.displayName == "Ana's laptop 💻")
        #expect(decoded.info.entries == entries)
        #expect(decoded.peerID == PeerID(fingerprint: Self.fingerprint, displayName: "Ana's laptop 💻"))
        #expect(decoded.peerID.displayName == "Ana's laptop 💻")
    }

    @Test func encodedOrderIsOwnKeysThenAppKeysSorted() throws {
        let info = try DiscoveryInfo(["zeta": "1", "alpha": "", "Beta": "ß", "mid": "x=y"])
        let record = TXTRecord(fingerprint: Self.fingerprint, displayName: "Ana", info: info)
        #expect(record.encoded() == txt("plv=1", plid, "plname=Ana", "Beta=ß", "alpha=", "mid=x=y", "zeta=1"))
        #expect(TXTRecord(version: 7, fingerprint: Self.fingerprint, displayName: "Ana", info: try DiscoveryInfo()).encoded()
            == txt("plv=7", plid, "plname=Ana"))
    }

    @Test(arguments: [
        ([], TXTRecord.DecodingError.missingKey("plv")),
        ([[]], .missingKey("plv")),
        (txt(plid, "plname=Ana"), .missingKey("plv")),
        (txt("plv=1", "plname=Ana"), .missingKey("plid")),
        (txt("plv=1", plid), .missingKey("plname")),
        (txt("plv=1", plid, "plname"), .badDisplayName(.displayNameEmpty)),
        (txt("txtvers=1", "path=/"), .missingKey("plv")),  // another program's record
        (txt("plv=abc", plid, "plname=Ana"), .badVersion("abc")),
        (txt("plv=0", plid, "plname=Ana"), .badVersion("0")),
        (txt("plv=-1", plid, "plname=Ana"), .badVersion("-1")),
        (txt("plv=", plid, "plname=Ana"), .badVersion("")),
        (txt("plv", plid, "plname=Ana"), .badVersion("")),
        (txt("plv= 1", plid, "plname=Ana"), .badVersion(" 1")),
        (txt("plv=+1", plid, "plname=Ana"), .badVersion("+1")),
        (txt("plv=99999999999999999999", plid, "plname=Ana"), .badVersion("99999999999999999999")),
        (txt("plv=1", "plid=0000000000000000", "plname=Ana"), .badFingerprint("0000000000000000")),
        (txt("plv=1", "plid=short", "plname=Ana"), .badFingerprint("short")),
        (txt("plv=1", "plid=", "plname=Ana"), .badFingerprint("")),
        (txt("plv=1", plid, "plname=Ana") + [Array("k=".utf8) + [0xFF, 0xFE]], .badUTF8(key: "k")),
        (txt("plv=1", plid) + [Array("plname=".utf8) + [0xFF, 0xFE]], .badUTF8(key: "plname")),
        (txt("plv=1", plid, "plname=Ana") + [Array("k=".utf8) + [0xC3]], .badUTF8(key: "k")),  // truncated é
        (txt("plv=1", plid, "plname=Ana", "k=" + String(repeating: "v", count: 254)), .oversizedString(bytes: 256)),
        (txt("plv=1", plid, "plname=Ana", String(repeating: "x", count: 300)), .oversizedString(bytes: 300)),
        (txt("plv=1", plid, "plname=" + String(repeating: "x", count: 64)), .badDisplayName(.displayNameTooLong(bytes: 64))),
        (txt("plv=1", plid, "plname=" + String(repeating: "é", count: 32)), .badDisplayName(.displayNameTooLong(bytes: 64))),
        (txt("plv=1", plid, "plname="), .badDisplayName(.displayNameEmpty)),
        (txt("plv=1", plid, "plname=Ana\nBob"), .badDisplayName(.displayNameControlCharacter)),
        // Two 255-byte entries: each is fine, the set is over 400 bytes.
        (txt("plv=1", plid, "plname=Ana", "a=" + String(repeating: "x", count: 253), "b=" + String(repeating: "y", count: 253)),
            .badInfo(.infoTooLarge(bytes: 512))),
        // Checked in order: version, fingerprint, name.
        (txt("plv=x", "plid=x", "plname="), .badVersion("x")),
        (txt("plv=1", "plid=x", "plname="), .badFingerprint("x")),
    ] as [([[UInt8]], TXTRecord.DecodingError)])
    func rejects(_ strings: [[UInt8]], _ error: TXTRecord.DecodingError) {
        #expect(throws: error) { try TXTRecord(decoding: strings) }
    }

    @Test func booleanAttributeHasAnEmptyValue() throws {
        let record = try TXTRecord(decoding: txt("plv=1", plid, "plname=Ana", "flag"))
        #expect(record.info["flag"] == "")
        #expect(record.info.count == 1)
    }

    @Test func emptyStringsAreSkipped() throws {
        let record = try TXTRecord(decoding: [[]] + txt("plv=1") + [[]] + txt(plid, "plname=Ana") + [[], []])
        #expect(record.displayName == "Ana")
        #expect(record.info.isEmpty)
    }

    /// RFC 6763 §6.4: strings starting with "=" (no key) are ignored; keys must be printable ASCII.
    @Test func stringsWithoutAUsableKeyAreIgnored() throws {
        let strings = txt("plv=1", plid, "plname=Ana", "=orphan", "=", "k\u{1}=x", "ké=x", "\t=x") + [[0xFF, 0x3D, 0x41]]
        let record = try TXTRecord(decoding: strings)
        #expect(record.info.isEmpty)
    }

    @Test func firstOfRepeatedKeysWinsIgnoringCase() throws {
        let record = try TXTRecord(decoding: txt(
            "plv=1", "PLV=2", plid, "plid=aaaaaaaaaaaaaaaa", "plname=Ana", "PLNAME=Bob", "plname=Carl",
            "Color=red", "color=blue", "COLOR=green", "flag", "flag=set"))
        #expect(record.version == 1)
        #expect(record.fingerprint == Self.fingerprint)
        #expect(record.displayName == "Ana")
        #expect(record.info.entries == ["Color": "red", "flag": ""])
    }

    /// A repeated key's later copy is ignored even when its value would be rejected.
    @Test func ignoredRepeatsAreNotValidated() throws {
        let record = try TXTRecord(decoding: txt("plv=1", plid, "plname=Ana", "k=1") + [Array("K=".utf8) + [0xFF]])
        #expect(record.info.entries == ["k": "1"])
    }

    @Test func ownKeysAreCaseInsensitive() throws {
        let record = try TXTRecord(decoding: txt("PLV=1", "PlId=" + KnownKeys.zeroToThirtyOneFingerprint.uppercased(), "PLNAME=Ana"))
        #expect(record.version == 1)
        #expect(record.fingerprint == Self.fingerprint)
        #expect(record.displayName == "Ana")
        #expect(record.info.isEmpty)
    }

    @Test func toleratesForeignKeysAndNewerVersions() throws {
        let record = try TXTRecord(decoding: txt("txtvers=1", "plv=2", "plid=mmg4-2klg-yqzw-neis", "plname=Ana", "path=/"))
        #expect(record.version == 2)
        #expect(record.fingerprint == Self.fingerprint)
        #expect(record.info.entries == ["txtvers": "1", "path": "/"])
    }

    @Test func acceptsStringsOfExactly255Bytes() throws {
        let long = "k=" + String(repeating: "v", count: 253)
        #expect(long.utf8.count == 255)
        let record = try TXTRecord(decoding: txt("plv=1", plid, "plname=Ana", long))
        #expect(record.info["k"]?.utf8.count == 253)
        let name = String(repeating: "€", count: 21)
        #expect(try TXTRecord(decoding: txt("plv=1", plid, "plname=" + name)).displayName == name)
    }

    @Test func valuesMayContainAnyValidUTF8() throws {
        let record = try TXTRecord(decoding: txt("plv=1", plid, "plname=Ana", "k=a\u{0}b\nc=d"))
        #expect(record.info["k"] == "a\u{0}b\nc=d")
    }

    @Test(arguments: [
        (TXTRecord.DecodingError.missingKey("plid"), ["plid="]),
        (.badVersion("abc"), ["'abc'"]),
        (.badFingerprint("xyz"), ["'xyz'", "16"]),
        (.badUTF8(key: "k"), ["k", "UTF-8"]),
        (.badDisplayName(.displayNameTooLong(bytes: 64)), ["64", "63"]),
        (.oversizedString(bytes: 256), ["256", "255"]),
        (.badInfo(.infoTooLarge(bytes: 512)), ["512", "400"]),
    ] as [(TXTRecord.DecodingError, [String])])
    func decodingErrorDescriptions(_ error: TXTRecord.DecodingError, _ fragments: [String]) {
        for fragment in fragments { #expect(error.description.contains(fragment), "\(error.description)") }
    }
}
