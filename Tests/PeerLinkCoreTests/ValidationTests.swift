import PeerLinkCore
import Testing

// MARK: - DisplayName

@Suite("DisplayName: 1–63 bytes of UTF-8, no control characters")
struct DisplayNameTests {
    @Test(arguments: [
        "a",
        "Ana",
        " ",
        "Ana's laptop",
        "Zoë",
        "Ångström café",
        "family \u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}",  // zero-width joiners inside an emoji are fine
        "👩‍💻 Ana",
        "李小龍の端末",
        String(repeating: "x", count: 63),
    ])
    func accepts(_ name: String) throws {
        let displayName = try DisplayName(name)
        #expect(displayName.value == name)
        #expect(displayName.description == name)
    }

    /// Multi-byte strings that land exactly on the 63-byte limit.
    @Test(arguments: [
        String(repeating: "é", count: 31) + "a",  // 2-byte scalars
        String(repeating: "€", count: 21),  // 3-byte scalars
        String(repeating: "😀", count: 15) + "abc",  // 4-byte scalars
    ])
    func acceptsMultiByteAtExactlyTheLimit(_ name: String) throws {
        #expect(name.utf8.count == DisplayName.maximumBytes)
        #expect(name.count < DisplayName.maximumBytes)
        #expect(try DisplayName(name).value == name)
    }

    @Test(arguments: [
        ("", ValidationError.displayNameEmpty),
        (String(repeating: "x", count: 64), .displayNameTooLong(bytes: 64)),
        (String(repeating: "x", count: 200), .displayNameTooLong(bytes: 200)),
        // Over 63 bytes but fewer than 63 characters: the limit is in bytes.
        (String(repeating: "é", count: 32), .displayNameTooLong(bytes: 64)),
        (String(repeating: "€", count: 22), .displayNameTooLong(bytes: 66)),
        (String(repeating: "😀", count: 16), .displayNameTooLong(bytes: 64)),
        ("a\nb", .displayNameControlCharacter),
        ("a\tb", .displayNameControlCharacter),
        ("a\rb", .displayNameControlCharacter),
        ("\r\n", .displayNameControlCharacter),
        ("a\u{0}b", .displayNameControlCharacter),
        ("a\u{1B}b", .displayNameControlCharacter),
        ("a\u{7F}b", .displayNameControlCharacter),  // DEL
        ("a\u{85}b", .displayNameControlCharacter),  // NEL, a C1 control
        ("a\u{2028}b", .displayNameControlCharacter),  // line separator
        ("a\u{2029}b", .displayNameControlCharacter),  // paragraph separator
        ("evil\u{202E}txt.exe", .displayNameControlCharacter),  // right-to-left override
        ("a\u{2066}b", .displayNameControlCharacter),  // left-to-right isolate
        ("Ana\n", .displayNameControlCharacter),
        // Length is checked before characters.
        ("\n" + String(repeating: "x", count: 63), .displayNameTooLong(bytes: 64)),
    ])
    func rejects(_ name: String, _ error: ValidationError) {
        #expect(throws: error) { try DisplayName(name) }
    }
}

// MARK: - ServiceType

@Suite("ServiceType: RFC 6335 service names as MPC uses them")
struct ServiceTypeTests {
    @Test(arguments: [
        "a",
        "chat",
        "peer-link",
        "x1",
        "1x",
        "a-b-c",
        "a1-2b",
        "peerlink",
        "abcdefghijklmno",  // 15 characters
        "12345678901234a",  // 15 characters, one letter
    ])
    func accepts(_ text: String) throws {
        let type = try ServiceType(text)
        #expect(type.value == text)
        #expect(type.description == text)
        #expect(type.dnsSDType == "_\(text)._tcp")
    }

    @Test(arguments: [
        ("", ValidationError.serviceTypeEmpty),
        ("abcdefghijklmnop", .serviceTypeTooLong(characters: 16)),
        (String(repeating: "a", count: 40), .serviceTypeTooLong(characters: 40)),
        ("Chat", .serviceTypeInvalidCharacter("C")),
        ("chat_1", .serviceTypeInvalidCharacter("_")),
        ("_chat", .serviceTypeInvalidCharacter("_")),
        ("ch.at", .serviceTypeInvalidCharacter(".")),
        ("ch at", .serviceTypeInvalidCharacter(" ")),
        ("chat\n", .serviceTypeInvalidCharacter("\n")),
        ("café", .serviceTypeInvalidCharacter("é")),
        ("cafe\u{301}", .serviceTypeInvalidCharacter("e\u{301}")),  // decomposed é
        ("ｃhat", .serviceTypeInvalidCharacter("ｃ")),  // full-width c
        ("123", .serviceTypeNoLetter),
        ("1-2", .serviceTypeNoLetter),
        ("-chat", .serviceTypeHyphenAtEdge),
        ("chat-", .serviceTypeHyphenAtEdge),
        ("-a-", .serviceTypeHyphenAtEdge),
        ("a--b", .serviceTypeDoubleHyphen),
        ("peer--link", .serviceTypeDoubleHyphen),
        // Precedence, as implemented: characters, then length, then letter, then edges, then "--".
        ("ABCDEFGHIJKLMNOPQ", .serviceTypeInvalidCharacter("A")),
        ("a--------------b", .serviceTypeTooLong(characters: 16)),
        ("-", .serviceTypeNoLetter),
        ("--", .serviceTypeNoLetter),
        ("-a--b", .serviceTypeHyphenAtEdge),
        // The DNS-SD form: the name alone is what to give; a name that breaks a rule says which.
        ("_chat._tcp", .serviceTypeDNSSDForm("_chat._tcp")),
        ("_peer-link._tcp.", .serviceTypeDNSSDForm("_peer-link._tcp.")),
        ("_chat._udp", .serviceTypeDNSSDForm("_chat._udp")),
        ("_Chat._tcp", .serviceTypeInvalidCharacter("C")),
        ("_abcdefghijklmnop._tcp", .serviceTypeTooLong(characters: 16)),
        ("_._tcp", .serviceTypeInvalidCharacter("_")),
        ("chat._tcp", .serviceTypeInvalidCharacter(".")),
    ])
    func rejects(_ text: String, _ error: ValidationError) {
        #expect(throws: error) { try ServiceType(text) }
    }

    @Test func dnsSDFormSaysWhatToGive() {
        let message = ValidationError.serviceTypeDNSSDForm("_chat._tcp").description
        #expect(message == "service type '_chat._tcp' is written as DNS-SD writes it: give the name alone, 'chat' (on the LAN it is advertised as _chat._tcp)")
    }

    @Test func dnsSDType() throws {
        #expect(try ServiceType("chat").dnsSDType == "_chat._tcp")
        #expect(try ServiceType("peer-link").dnsSDType == "_peer-link._tcp")
        #expect(ServiceType.default.value == "peerlink")
        #expect(ServiceType.default.dnsSDType == "_peerlink._tcp")
    }
}

// MARK: - DiscoveryInfo

@Suite("DiscoveryInfo: one DNS-SD TXT record of app keys and values")
struct DiscoveryInfoTests {
    @Test(arguments: [
        [:],
        ["color": "blue"],
        ["color": "blue", "size": "L"],
        ["name": "Zoë 👩‍💻", "empty": ""],
        ["with space": "x", "~!@#$%^&*()": "punctuation"],
        ["eq": "a=b=c"],
        ["k": String(repeating: "v", count: 253)],  // k=vvv… is exactly 255 bytes
        ["k": String(repeating: "é", count: 126) + "v"],  // 1 + 1 + 253 = 255 bytes, 129 characters
        ["a": String(repeating: "x", count: 197), "b": String(repeating: "y", count: 197)],  // 200 + 200 = 400
    ] as [[String: String]])
    func accepts(_ entries: [String: String]) throws {
        let info = try DiscoveryInfo(entries)
        #expect(info.entries == entries)
        #expect(info.count == entries.count)
        #expect(info.isEmpty == entries.isEmpty)
        for (key, value) in entries { #expect(info[key] == value) }
        #expect(Dictionary(uniqueKeysWithValues: info.map { ($0.key, $0.value) }) == entries)
    }

    @Test func defaultIsEmpty() throws {
        let info = try DiscoveryInfo()
        #expect(info.isEmpty)
        #expect(info.count == 0)
        #expect(info["anything"] == nil)
    }

    /// Eighty entries `kNN=` cost 1 + 3 + 1 = 5 bytes each: exactly 400 in all.
    static let eightyEmptyEntries = Dictionary(
        uniqueKeysWithValues: (0..<80).map { (String(format2: $0), "") })

    @Test func totalIsCountedWithLengthByteAndEquals() throws {
        #expect(try DiscoveryInfo(Self.eightyEmptyEntries).count == 80)
        var oneMore = Self.eightyEmptyEntries
        oneMore["k00"] = "x"
        #expect(throws: ValidationError.infoTooLarge(bytes: 401)) { try DiscoveryInfo(oneMore) }
    }

    @Test(arguments: [
        (["a=b": "1"], ValidationError.infoKeyContainsEquals(key: "a=b")),
        (["=": "1"], .infoKeyContainsEquals(key: "=")),
        (["": "x"], .infoKeyEmpty),
        (["ké": "x"], .infoKeyNotPrintableASCII(key: "ké")),
        (["a\tb": "x"], .infoKeyNotPrintableASCII(key: "a\tb")),
        (["a\u{7F}": "x"], .infoKeyNotPrintableASCII(key: "a\u{7F}")),
        (["a\u{0}": "x"], .infoKeyNotPrintableASCII(key: "a\u{0}")),
        (["plv": "1"], .infoKeyReserved(key: "plv")),
        (["plid": "x"], .infoKeyReserved(key: "plid")),
        (["plname": "x"], .infoKeyReserved(key: "plname")),
        (["PLID": "x"], .infoKeyReserved(key: "PLID")),
        (["PlName": "x"], .infoKeyReserved(key: "PlName")),
        (["Key": "1", "key": "2"], .infoKeyDuplicate(key: "key")),  // keys checked in sorted order
        (["COLOR": "1", "color": "2", "Color": "3"], .infoKeyDuplicate(key: "Color")),
        (["k": String(repeating: "v", count: 254)], .infoEntryTooLong(key: "k", bytes: 256)),
        (["k": String(repeating: "é", count: 127)], .infoEntryTooLong(key: "k", bytes: 256)),  // 129 characters
        (["a": String(repeating: "x", count: 198), "b": String(repeating: "y", count: 197)], .infoTooLarge(bytes: 401)),
    ] as [([String: String], ValidationError)])
    func rejects(_ entries: [String: String], _ error: ValidationError) {
        #expect(throws: error) { try DiscoveryInfo(entries) }
    }

    @Test(arguments: [
        ([], [:]),
        (["a=b"], ["a": "b"]),
        (["a=b=c"], ["a": "b=c"]),
        (["a="], ["a": ""]),
        (["a=="], ["a": "="]),
        (["color=blue", "size=L"], ["color": "blue", "size": "L"]),
        (["name=Zoë 👩‍💻"], ["name": "Zoë 👩‍💻"]),
        (["with space=x y"], ["with space": "x y"]),
    ] as [([String], [String: String])])
    func parsesArguments(_ arguments: [String], _ expected: [String: String]) throws {
        #expect(try DiscoveryInfo(arguments: arguments).entries == expected)
    }

    @Test(arguments: [
        (["novalue"], ValidationError.infoArgumentMalformed("novalue")),
        ([""], .infoArgumentMalformed("")),
        (["a=1", "novalue"], .infoArgumentMalformed("novalue")),
        (["=x"], .infoKeyEmpty),
        (["="], .infoKeyEmpty),
        (["a=1", "a=2"], .infoKeyDuplicate(key: "a")),
        (["A=1", "a=2"], .infoKeyDuplicate(key: "a")),
        (["plv=2"], .infoKeyReserved(key: "plv")),
        (["ké=1"], .infoKeyNotPrintableASCII(key: "ké")),
        (["k=" + String(repeating: "v", count: 254)], .infoEntryTooLong(key: "k", bytes: 256)),
    ] as [([String], ValidationError)])
    func rejectsArguments(_ arguments: [String], _ error: ValidationError) {
        #expect(throws: error) { try DiscoveryInfo(arguments: arguments) }
    }
}

// MARK: - Messages

@Suite("ValidationError messages name the rule")
struct ValidationErrorMessageTests {
    @Test(arguments: [
        (ValidationError.displayNameEmpty, ["empty", "63", "bytes"]),
        (.displayNameTooLong(bytes: 64), ["64 bytes", "63"]),
        (.displayNameControlCharacter, ["control"]),
        (.serviceTypeEmpty, ["empty", "15"]),
        (.serviceTypeTooLong(characters: 16), ["16 characters", "15"]),
        (.serviceTypeInvalidCharacter("C"), ["'C'", "lowercase"]),
        (.serviceTypeInvalidCharacter("\n"), ["'\\n'"]),
        (.serviceTypeNoLetter, ["letter"]),
        (.serviceTypeHyphenAtEdge, ["hyphen"]),
        (.serviceTypeDoubleHyphen, ["two hyphens"]),
        (.infoKeyEmpty, ["empty key"]),
        (.infoKeyContainsEquals(key: "a=b"), ["'a=b'", "'='"]),
        (.infoKeyNotPrintableASCII(key: "a\tb"), ["'a\\tb'", "printable ASCII"]),
        (.infoKeyReserved(key: "plid"), ["'plid'", "reserved"]),
        (.infoKeyDuplicate(key: "Key"), ["'Key'", "case-insensitive"]),
        (.infoEntryTooLong(key: "k", bytes: 256), ["'k'", "256", "255"]),
        (.infoTooLarge(bytes: 401), ["401", "400"]),
        (.infoArgumentMalformed("novalue"), ["'novalue'", "key=value"]),
    ] as [(ValidationError, [String])])
    func descriptionNamesTheRule(_ error: ValidationError, _ fragments: [String]) {
        let message = error.description
        for fragment in fragments {
            #expect(message.contains(fragment), "\(message.debugDescription) lacks \(fragment.debugDescription)")
        }
        // Control characters are shown escaped, never raw.
        #expect(!message.unicodeScalars.contains { $0.properties.generalCategory == .control })
        #expect(error.peerLinkError.code == .invalidParameter)
        #expect(error.peerLinkError.message == message)
        #expect(error.peerLinkError.description == message)
    }
}

extension String {
    /// `k00` … `k99`.
    fileprivate init(format2 number: Int) {
        self = "k" + (number < 10 ? "0" : "") + String(number)
    }
}
