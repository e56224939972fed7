import Foundation
import PeerLinkBluetooth
import PeerLinkCore
import PeerLinkPosix

/// Every fuzz target, by name. Each reads what a peer (or a file on disk) could hand PeerLink.
enum Catalog {
    static let targets: [FuzzTarget] = [
        preface, verdict, record, frame, control, hello, linkListener, linkDialer, linkEstablished, noise, streams, session,
        resource, resumeRecord, resourceName, txt, sdpElement, sdpSearch, dbus, identityFile, knownPeersFile, endpoint, peerText,
    ]

    static func named(_ name: String) -> FuzzTarget? { targets.first { $0.name == name } }

    // MARK: - The link, before authentication

    static let preface = FuzzTarget(
        name: "preface", summary: "the cleartext link preface (LinkPreface.parse)",
        run: { bytes in
            guard let (preface, length) = try? LinkPreface.parse(prefix: bytes[...]) else { return }
            check(preface.encoded() == Array(bytes.prefix(length)), "a preface re-encodes to other bytes")
            check((try? LinkPreface.decode(bytes.prefix(length))) == preface, "decode disagrees with parse")
        },
        seeds: { [Fixtures.preface.encoded(), Fixtures.plainPreface.encoded(), try! LinkPreface(versions: [2, 1], encryption: .required, service: Fixtures.service).encoded()] })

    static let verdict = FuzzTarget(
        name: "verdict", summary: "the verdict after a preface, with a peer's reason (Verdict.parse)",
        run: { bytes in
            guard let (verdict, length) = Verdict.parse(prefix: bytes[...]) else { return }
            check(length <= bytes.count, "a verdict longer than its input")
            if case .refuse(_, let reason) = verdict {
                check(reason.utf8.count <= PeerText.decodedReasonBytes, "a reason longer than the decoded limit")
                check(!reason.unicodeScalars.contains { $0 != "\\" && PeerText.needsEscape($0) }, "a reason with a raw control character")
            }
        },
        seeds: { [Verdict.accept.encoded(), Verdict.refuse(code: .encryptionMismatch, reason: "this peer requires encryption").encoded()] })

    static let record = FuzzTarget(
        name: "record", summary: "records (2-byte length) fed whole and in pieces (RecordDecoder)",
        run: { bytes in
            var input = FuzzInput(bytes)
            let maximum = Int(input.byte()) * 64 + 1
            let data = input.rest
            var whole = RecordDecoder(maxRecordLength: maximum)
            let all = whole.decode(data)
            var split = RecordDecoder(maxRecordLength: maximum)
            var results: [Result<[UInt8], WireError>] = []
            for piece in FuzzInput.cut(data, seed: bytes.last ?? 0) { results += split.decode(piece) }
            check(results == all, "pieces decode to other records than the whole")
            check(whole.bufferedByteCount <= maximum + 2, "more buffered than one record")
        },
        seeds: { [[4] + Record.framed([1, 2, 3]) + Record.framed([]), [0, 0, 5, 1, 2]] })

    static let frame = FuzzTarget(
        name: "frame", summary: "frames and control messages in a record (Frame.decodeRecord), at both frame limits",
        run: { bytes in
            _ = try? FrameHeader.decode(bytes[...])
            var decodedSmall = false
            // the limit every link has, and the one of a link whose two sides take large frames
            for limit in [WireFormat.maxFramePayload, WireFormat.largeFramePayload] {
                guard let frames = try? Frame.decodeRecord(bytes[...], payloadLimit: limit) else {
                    check(!decodedSmall, "a record decodes under the small frame limit but not under the large one")
                    return
                }
                if limit == WireFormat.maxFramePayload { decodedSmall = true }
                // every frame encodes again with its sequence number (if it is sequenced)
                var encoded: [UInt8] = []
                for (frame, sequence) in frames {
                    guard let bytes = try? frame.encoded(sequence: sequence, payloadLimit: limit) else {
                        preconditionFailure(
                            "fuzz check failed: a decoded frame does not encode: \(frame), sequence \(sequence.map(String.init) ?? "none")")
                    }
                    encoded += bytes
                }
                guard let again = try? Frame.decodeRecord(encoded[...], payloadLimit: limit), again.count == frames.count else {
                    preconditionFailure("fuzz check failed: decoded frames do not decode once re-encoded: \(frames.map(\.frame))")
                }
                for (before, after) in zip(frames, again) {
                    check(before.sequence == after.sequence, "a sequence number changes in a round trip: \(before) / \(after)")
                    if case .goAway = before.frame { continue }  // reasons are escaped when decoded: not a fixed point
                    check(before.frame == after.frame, "a frame changes in a round trip: \(before.frame) / \(after.frame)")
                }
            }
        },
        seeds: {
            let each = Fixtures.sampleFrames.enumerated().map { index, frame in Fixtures.encoded(frame, sequence: UInt64(index + 1)) }
            return each + [each.joined().map { $0 }]  // a record of several frames too
        })

    static let control = FuzzTarget(
        name: "control", summary: "session control messages (ControlMessage.decode)",
        run: { bytes in
            guard let message = try? ControlMessage.decode(bytes) else { return }
            check((try? ControlMessage.decode(message.encoded())) == message, "a control message changes in a round trip: \(message)")
        },
        seeds: {
            Fixtures.sampleFrames.compactMap { frame -> [UInt8]? in
                guard case .control(let message) = frame else { return nil }
                return try? message.encoded()
            }
        })

    static let hello = FuzzTarget(
        name: "hello", summary: "the hello carried by the handshake (Hello.decode)",
        run: { bytes in
            guard let hello = try? Hello.decode(bytes) else { return }
            check((try? Hello.decode(hello.encoded())) == hello, "a hello changes in a round trip")
        },
        seeds: {
            [
                Fixtures.hello.encoded(), Hello(displayName: try! DisplayName("Ana")).encoded() + [9, 0, 2, 1, 2],
                Hello(displayName: try! DisplayName("Bo"), maxFramePayload: WireFormat.largeFramePayload).encoded(),
            ]
        })

    /// A link state machine fed `bytes` in pieces, with the clock moving between them.
    static func drive(_ machine: inout LinkStateMachine, _ bytes: [UInt8]) {
        var input = FuzzInput(bytes)
        var now = Duration.zero
        _ = machine.start(at: now)
        for piece in input.pieces() {
            now += .milliseconds(Int(piece.first ?? 0))
            _ = machine.receive(piece, at: now)
            check(machine.bufferedByteCount <= WireFormat.maxBufferedBytes, "a link holds \(machine.bufferedByteCount) bytes")
            if machine.state == .closed { break }
        }
        _ = machine.tick(at: now + .seconds(11))
        _ = machine.receiveEnd(at: now + .seconds(11))
        check(machine.state == .closed, "a link survives the handshake timeout and the end of its stream")
    }

    static let linkListener = FuzzTarget(
        name: "link-listener", summary: "a listening link's preface, verdict and Noise handshake (responder) fed anything",
        run: { bytes in
            var machine = LinkStateMachine(role: .listener, identity: Fixtures.identity, preface: Fixtures.preface, hello: Fixtures.hello)
            drive(&machine, bytes)
        },
        seeds: { [[255] + Fixtures.preface.encoded() + [0] + Record.framed([UInt8](repeating: 9, count: 32))] })

    static let linkDialer = FuzzTarget(
        name: "link-dialer", summary: "a dialling link's preface, verdict and Noise handshake (initiator) fed anything",
        run: { bytes in
            var machine = LinkStateMachine(role: .dialer, identity: Fixtures.identity, preface: Fixtures.preface, hello: Fixtures.hello)
            drive(&machine, bytes)
        },
        seeds: { [[255] + Fixtures.preface.encoded() + [0] + Record.framed([UInt8](repeating: 9, count: 96))] })

    static let linkEstablished = FuzzTarget(
        name: "link-established", summary: "records after an unencrypted handshake: frames, pings, GO_AWAY (LinkStateMachine)",
        run: { bytes in
            var machine = Fixtures.establishedListener
            var input = FuzzInput(bytes)
            var now = Duration.zero
            for piece in input.pieces() {
                now += .milliseconds(Int(piece.first ?? 0) * 10)
                // After the close (its own GO_AWAY) the machine still reads records, for the
                // peer's GO_AWAY only: nothing comes out of it then.
                let wasClosed = machine.state == .closed
                let outputs = machine.receive(piece, at: now)
                check(!wasClosed || outputs.isEmpty, "a closed link gave \(outputs)")
                for output in outputs {
                    if case .closed(_, let reason, true) = output {
                        check(!reason.unicodeScalars.contains { $0 != "\\" && PeerText.needsEscape($0) }, "a raw reason")
                    }
                }
                _ = machine.tick(at: now)
                check(machine.bufferedByteCount <= WireFormat.maxBufferedBytes, "a link holds \(machine.bufferedByteCount) bytes")
            }
        },
        seeds: {
            [Fixtures.sampleFrames.enumerated().reduce(into: [UInt8]()) { bytes, item in
                let (index, frame) = item
                let record = Record.framed(Fixtures.encoded(frame, sequence: UInt64(index + 1)))
                bytes += [UInt8(record.count - 1)] + record
            }]
        })

    static let noise = FuzzTarget(
        name: "noise", summary: "Noise XX handshake states, both roles, reading arbitrary messages",
        run: { bytes in
            var input = FuzzInput(bytes)
            let initiator = input.byte() & 1 == 1
            var state = NoiseHandshakeState.xx(initiator: initiator, prologue: input.take(Int(input.byte() % 64)), staticKey: Fixtures.identity.privateKey)
            var messages = input.rest
            for _ in 0..<3 where !state.isComplete {
                if state.isWriteTurn {
                    guard (try? state.writeMessage(payload: Fixtures.hello.encoded())) != nil else { return }
                } else {
                    let length = messages.isEmpty ? 0 : min(messages.count - 1, Int(messages[0]) * 4)
                    let message = Array(messages.dropFirst().prefix(length))
                    messages = Array(messages.dropFirst(1 + length))
                    guard (try? state.readMessage(message)) != nil else { return }
                }
            }
        },
        seeds: { [[0, 0] + [24] + [UInt8](repeating: 5, count: 96), [1, 3, 1, 2, 3] + [24] + [UInt8](repeating: 5, count: 96)] })

    static let streams = FuzzTarget(
        name: "streams", summary: "stream frames into a link's stream table (StreamTable.receive)",
        run: { bytes in
            let tuning = StreamTable.WindowTuning(targetDelay: .microseconds(750), maximumWindow: 16384, maximumGrowth: 16384)
            var table = StreamTable(role: .listener, initialWindow: 4096, maxStreams: 8, tuning: tuning)
            var decoder = FrameDecoder()
            var now = Duration.zero
            for result in decoder.decode(bytes) {
                guard case .success(let frame) = result else { return }
                guard let outcome = try? table.receive(frame) else { return }
                check(table.openCounts.incoming <= 8, "more streams open than allowed")
                // The reader takes what arrived, at a pace the input's byte counts decide.
                for case .data(let id, let bytes) in outcome.events {
                    now += .microseconds(bytes.count % 97)
                    _ = table.consumed(id, count: bytes.count, at: now)
                }
                let growth = table.entries.values.reduce(0) { $0 + $1.receiveLimit - 4096 }
                check(table.entries.values.allSatisfy { (4096...16384).contains($0.receiveLimit) }, "a window outside its bounds")
                check(growth <= 16384, "windows grown past the growth allowed")
            }
        },
        seeds: {
            [[Frame.data(stream: 1, flags: .syn, payload: FramePayload("a".utf8)), .data(stream: 1, flags: [], payload: [1, 2]), .windowUpdate(stream: 2, flags: .ack, credit: 5),
              .data(stream: 1, flags: .fin, payload: []), .data(stream: 3, flags: .rst, payload: FramePayload("no".utf8))].reduce(into: [UInt8]()) { $0 += Record.framed(Fixtures.encoded($1)) }]
        })

    static let session = FuzzTarget(
        name: "session", summary: "frames from an authenticated peer into the session state machine",
        run: { bytes in
            guard var machine = try? SessionStateMachine(
                localPeer: PeerID(identity: Fixtures.identity, displayName: try! DisplayName("fuzz")), serviceType: Fixtures.service,
                policy: SessionPolicy(automatic: bytes.first.map { $0 & 1 == 1 } ?? false))
            else { return }
            let link = LinkID(1)
            var now = Duration.zero
            _ = machine.linkEstablished(link, peer: Fixtures.peer, dialedLocally: false, at: now)
            var decoder = FrameDecoder()
            for result in decoder.decode(Array(bytes.dropFirst())) {
                guard case .success(let frame) = result else { break }
                now += .milliseconds(100)
                _ = machine.frameReceived(frame, on: link, at: now)
                while machine.nextFrame(for: link) != nil {}
                _ = machine.tick(at: now)
            }
            _ = machine.tick(at: now + .seconds(60))
            _ = machine.linkClosed(link, code: .normal, reason: "fuzz", at: now + .seconds(61))
        },
        seeds: { [[1] + Fixtures.sampleFrames.reduce(into: [UInt8]()) { $0 += Record.framed(Fixtures.encoded($1)) }] })

    // MARK: - Files (resources)

    static let resource = FuzzTarget(
        name: "resource", summary: "resource (file transfer) messages on a stream, whole and in pieces (ResourceMessageDecoder)",
        run: { bytes in
            var whole = ResourceMessageDecoder()
            whole.append(bytes)
            var first: [ResourceMessage] = []
            while let message = try? whole.next() { first.append(message) }
            var split = ResourceMessageDecoder()
            var second: [ResourceMessage] = []
            for piece in FuzzInput.cut(bytes, seed: bytes.last ?? 0) {
                split.append(piece)
                while let message = try? split.next() { second.append(message) }
            }
            check(first == second.prefix(first.count).map { $0 }, "pieces decode to other messages")
            for message in first {
                if case .data = message { continue }
                _ = try? message.encoded()
            }
        },
        seeds: {
            let offer = ResourceOffer(transferID: TransferID.derived(sha256: [UInt8](repeating: 1, count: 32), size: 10, name: "a.txt"), name: "a.txt", size: 10, sha256: [UInt8](repeating: 1, count: 32))
            let messages: [ResourceMessage] = [.offer(offer), .accept(offset: 0), .data([1, 2, 3]), .verdict(.verified), .verdict(.error("disk full")), .decline(reason: "no"), .cancel(reason: "stop")]
            return [messages.reduce(into: [UInt8]()) { $0 += try! $1.encoded() }]
        })

    static let resumeRecord = FuzzTarget(
        name: "resume-record", summary: "a partial file's .meta record read from disk (ResumeBook.decide)",
        run: { bytes in
            var input = FuzzInput(bytes)
            let size = UInt64(input.byte()) << 8 | UInt64(input.byte())
            let partial = UInt64(input.byte()) << 8 | UInt64(input.byte())
            let offer = ResourceOffer(transferID: TransferID.derived(sha256: [UInt8](repeating: 2, count: 32), size: size, name: "f"), name: "f", size: size, sha256: [UInt8](repeating: 2, count: 32))
            _ = ResumeBook.decide(offer: offer, record: input.rest, partialLength: partial)
        },
        seeds: {
            let offer = ResourceOffer(transferID: TransferID.derived(sha256: [UInt8](repeating: 2, count: 32), size: 300, name: "f"), name: "f", size: 300, sha256: [UInt8](repeating: 2, count: 32))
            return [[1, 44, 0, 100] + ResumeBook.record(for: offer)]
        })

    static let resourceName = FuzzTarget(
        name: "resource-name", summary: "a file name a peer offers, made safe (ResourceName.sanitized)",
        run: { bytes in
            let name = ResourceName.sanitized(String(decoding: bytes, as: UTF8.self))
            check(!name.isEmpty && name.utf8.count <= ResourceName.maximumBytes, "a name of \(name.utf8.count) bytes")
            check(!name.contains("/") && !name.hasPrefix("."), "an unsafe name: \(name)")
            check(ResourceName.sanitized(name) == name, "sanitising twice changes the name")
        },
        seeds: { [Array("../../etc/passwd".utf8), Array("photo.jpg".utf8), Array("\u{202E}gpj.exe".utf8)] })

    // MARK: - Discovery

    static let txt = FuzzTarget(
        name: "txt", summary: "DNS-SD TXT records (length-prefixed strings) into a PeerLink record",
        run: { bytes in
            var strings: [[UInt8]] = []
            var index = 0
            while index < bytes.count {
                let length = Int(bytes[index])
                strings.append(Array(bytes[(index + 1)..<min(bytes.count, index + 1 + length)]))
                index += 1 + length
            }
            guard let record = try? TXTRecord(decoding: strings) else { return }
            check((try? TXTRecord(decoding: record.encoded())) == record, "a TXT record changes in a round trip")
        },
        seeds: {
            let record = TXTRecord(fingerprint: Fixtures.identity.fingerprint, displayName: "Ana", info: try! DiscoveryInfo(["room": "kitchen"]))
            return [record.encoded().reduce(into: [UInt8]()) { $0 += [UInt8($1.count)] + $1 }]
        })

    static let sdpElement = FuzzTarget(
        name: "sdp-element", summary: "SDP data elements (SDPElement.decode)",
        run: { bytes in
            guard let (element, length) = try? SDPElement.decode(bytes[...]) else { return }
            check(length <= bytes.count, "an element longer than its input")
            check((try? SDPElement(decoding: element.encoded())) == element, "an element changes in a round trip")
        },
        seeds: {
            let record = PeerLinkServiceRecord(
                serviceType: Fixtures.service,
                record: TXTRecord(fingerprint: Fixtures.identity.fingerprint, displayName: "Ana", info: try! DiscoveryInfo()),
                channel: RFCOMMChannel(3), psm: L2CAPPSM(0x1001))
            return record.attributes.values.map { $0.encoded() }
        })

    static let sdpSearch = FuzzTarget(
        name: "sdp-search", summary: "SDP service search attribute responses, continued over several PDUs, into PeerLink records",
        run: { bytes in
            var search = SDPServiceSearch(pattern: [Fixtures.service.bluetoothServiceClass])
            var input = FuzzInput(bytes)
            for _ in 0..<70 where !input.isEmpty {
                let length = Int(input.byte()) << 2
                do {
                    switch try search.receive(input.take(length)) {
                    case .continuing: continue
                    case .finished(let records):
                        for attributes in records {
                            _ = PeerLinkServiceRecord.servedPorts(attributes)
                            if let record = try? PeerLinkServiceRecord(serviceType: Fixtures.service, attributes: attributes) {
                                _ = record.endpoints(at: BluetoothAddress("00:AA:01:00:00:00")!)
                            }
                        }
                        return
                    }
                } catch {
                    return
                }
            }
        },
        seeds: {
            let record = PeerLinkServiceRecord(
                serviceType: Fixtures.service,
                record: TXTRecord(fingerprint: Fixtures.identity.fingerprint, displayName: "Ana", info: try! DiscoveryInfo()),
                channel: RFCOMMChannel(3), psm: L2CAPPSM(0x1001))
            var list: [SDPElement] = []
            for (id, value) in record.attributes.sorted(by: { $0.key < $1.key }) { list += [.uint16(id), value] }
            let lists = SDPElement.sequence([.sequence(list)]).encoded()
            var parameters: [UInt8] = [UInt8(lists.count >> 8), UInt8(lists.count & 0xFF)] + lists + [0]
            let pdu: [UInt8] = [SDPServiceSearch.responsePDU, 0, 1, UInt8(parameters.count >> 8), UInt8(parameters.count & 0xFF)] + parameters
            parameters = []
            // Lengths are counted in fours by the target: pad the PDU to a multiple of 4.
            let padded = pdu + [UInt8](repeating: 0, count: (4 - pdu.count % 4) % 4)
            return [[UInt8(padded.count / 4)] + padded]
        })

    static let dbus = FuzzTarget(
        name: "dbus", summary: "D-Bus messages as bytes (libdbus demarshals and validates), read by PeerLink's codec",
        run: { bytes in _ = DBusFuzzing.readArguments(ofMarshalled: bytes) },
        seeds: { [DBusFuzzing.marshalledSample()] })

    // MARK: - Files on disk

    static let identityFile = FuzzTarget(
        name: "identity-file", summary: "the identity file (Identity(fileContents:))",
        run: { bytes in
            guard let identity = try? Identity(fileContents: Data(bytes)) else { return }
            check((try? Identity(fileContents: identity.fileContents()))?.fingerprint == identity.fingerprint, "an identity changes in a round trip")
        },
        seeds: { [Array(Fixtures.identity.fileContents())] })

    static let knownPeersFile = FuzzTarget(
        name: "known-peers-file", summary: "the known-peers file (KnownPeers(fileContents:))",
        run: { bytes in
            guard let peers = KnownPeers(fileContents: Data(bytes)) else { return }
            check(KnownPeers(fileContents: peers.fileContents()) == peers, "known peers change in a round trip")
        },
        seeds: {
            var peers = KnownPeers()
            _ = peers.meet(Fixtures.peer, at: 1_700_000_000)
            _ = peers.meet(PeerID(fingerprint: Fixtures.identity.fingerprint, displayName: "Ana"), at: 1_700_000_100)
            return [Array(peers.fileContents())]
        })

    // MARK: - Text

    static let endpoint = FuzzTarget(
        name: "endpoint", summary: "endpoints as typed or advertised (Endpoint(parsing:))",
        run: { bytes in
            let schemes: [EndpointScheme] = [.tcp, .bluetooth]
            guard let endpoint = try? Endpoint(parsing: String(decoding: bytes, as: UTF8.self), schemes: schemes) else { return }
            _ = endpoint.description
            _ = endpoint.address.fields
            if endpoint.kind == .tcp { return }  // any text is taken as a host name: not a fixed point
            check((try? Endpoint(parsing: endpoint.description, schemes: schemes)) == endpoint, "an endpoint changes in a round trip: \(endpoint)")
        },
        seeds: { ["tcp://127.0.0.1:4000", "tcp://[::1]:4000", "bt://00:AA:01:00:00:00/l2cap/0x1001", "bt://00:AA:01:00:00:00/rfcomm/3", "memory://x"].map { Array($0.utf8) } })

    static let peerText = FuzzTarget(
        name: "peer-text", summary: "text a peer chose, made safe to print (PeerText.sanitized)",
        run: { bytes in
            var input = FuzzInput(bytes)
            let limit = Int(input.byte())
            let text = PeerText.sanitized(bytes: input.rest, limit: limit)
            check(text.utf8.count <= limit, "\(text.utf8.count) bytes over a limit of \(limit)")
            check(!text.unicodeScalars.contains { $0 != "\\" && PeerText.needsEscape($0) }, "a raw control character survived")
        },
        seeds: { [[40] + Array("\r* mallory joined\u{1B}]0;x\u{07}\u{202E}".utf8)] })
}
