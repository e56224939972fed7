/// The client side of one SDP ServiceSearchAttribute transaction (Bluetooth Core, Vol 3, Part B,
/// §4.7), with no I/O: it makes request PDUs, takes response PDUs, and follows continuation
/// states until the server sent all attribute lists.
///
/// Use: send ``nextRequest()``, give each response to ``receive(_:)`` until it returns
/// `.finished`, sending ``nextRequest()`` again after each `.continuing`.
public struct SDPServiceSearch: Sendable {
    public static let errorResponse: UInt8 = 0x01
    public static let requestPDU: UInt8 = 0x06
    public static let responsePDU: UInt8 = 0x07

    public let pattern: [BluetoothUUID]
    public let maximumAttributeBytes: UInt16
    private var transaction: UInt16
    private var continuation: [UInt8] = []
    private var collected: [UInt8] = []
    private var rounds = 0

    public enum Progress: Hashable, Sendable {
        case continuing
        /// Each matching service record's attributes.
        case finished([[UInt16: SDPElement]])
    }

    public enum Failure: Error, Hashable, Sendable, CustomStringConvertible {
        case serverError(code: UInt16)
        case malformed(String)
        case tooManyContinuations

        public var description: String {
            switch self {
            case .serverError(let code): return "the SDP server answered with error \(SDPServiceSearch.hex(code))"
            case .malformed(let what): return "malformed SDP response: \(what)"
            case .tooManyContinuations: return "the SDP server kept sending continuations (more than 64)"
            }
        }
    }

    public init(pattern: [BluetoothUUID], maximumAttributeBytes: UInt16 = 0xFFFF, transaction: UInt16 = 1) {
        self.pattern = pattern
        self.maximumAttributeBytes = maximumAttributeBytes
        self.transaction = transaction
    }

    /// The next request PDU: the search for the pattern (every attribute), with the last
    /// continuation state received.
    public func nextRequest() -> [UInt8] {
        var parameters: [UInt8] = []
        SDPElement.sequence(pattern.map(SDPElement.uuid128)).encode(into: &parameters)
        parameters += SDPElement.bigEndian(maximumAttributeBytes)
        SDPElement.sequence([.uint32(0x0000_FFFF)]).encode(into: &parameters)
        parameters.append(UInt8(continuation.count))
        parameters += continuation
        return [Self.requestPDU] + SDPElement.bigEndian(transaction) + SDPElement.bigEndian(UInt16(parameters.count)) + parameters
    }

    /// Takes a response PDU.
    public mutating func receive(_ pdu: [UInt8]) throws(Failure) -> Progress {
        guard pdu.count >= 5 else { throw .malformed("\(pdu.count)-byte PDU") }
        let length = Int(pdu[3]) << 8 | Int(pdu[4])
        guard pdu.count >= 5 + length else { throw .malformed("parameter length \(length) exceeds the PDU") }
        let parameters = Array(pdu[5..<(5 + length)])
        if pdu[0] == Self.errorResponse {
            throw .serverError(code: parameters.count >= 2 ? UInt16(parameters[0]) << 8 | UInt16(parameters[1]) : 0)
        }
        guard pdu[0] == Self.responsePDU else { throw .malformed("PDU \(Self.hex(UInt16(pdu[0])))") }
        guard parameters.count >= 3 else { throw .malformed("no attribute list byte count") }
        let count = Int(parameters[0]) << 8 | Int(parameters[1])
        guard parameters.count >= 2 + count + 1 else { throw .malformed("attribute lists cut short") }
        collected += parameters[2..<(2 + count)]
        let stateLength = Int(parameters[2 + count])
        guard stateLength <= 16, parameters.count >= 3 + count + stateLength else { throw .malformed("bad continuation state") }
        continuation = Array(parameters[(3 + count)..<(3 + count + stateLength)])
        transaction &+= 1
        rounds += 1
        if !continuation.isEmpty {
            guard rounds < 64 else { throw .tooManyContinuations }
            return .continuing
        }
        return .finished(try Self.records(collected))
    }

    /// The records of a complete AttributeLists element: ⟨⟨id, value, id, value…⟩…⟩.
    static func records(_ bytes: [UInt8]) throws(Failure) -> [[UInt16: SDPElement]] {
        let lists: SDPElement
        do {
            lists = try SDPElement(decoding: bytes)
        } catch {
            throw .malformed(error.description)
        }
        guard let records = lists.elements else { throw .malformed("attribute lists are not a sequence") }
        return try records.map { (record: SDPElement) throws(Failure) -> [UInt16: SDPElement] in
            guard let items = record.elements, items.count % 2 == 0 else { throw .malformed("an attribute list is not id/value pairs") }
            var attributes: [UInt16: SDPElement] = [:]
            for index in stride(from: 0, to: items.count, by: 2) {
                guard case .uint16(let id) = items[index] else { throw .malformed("an attribute ID is not a uint16") }
                attributes[id] = items[index + 1]
            }
            return attributes
        }
    }

    static func hex(_ value: UInt16) -> String {
        let text = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 4 - text.count)) + text
    }
}
