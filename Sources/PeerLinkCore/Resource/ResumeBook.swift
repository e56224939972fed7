/// The receiver's bookkeeping for resuming transfers: where a partial file lives, what it was
/// for, and at which offset a re-offer continues.
///
/// A receiver keeps each unfinished transfer as two files in the destination directory, named
/// after the sender's fingerprint and the transfer ID (``partialName(sender:transfer:)``): the
/// bytes received so far (`.part`) and a small record of the offer they belong to (`.meta`,
/// ``record(for:)``). When the same sender offers the same transfer again, ``decide(offer:record:partialLength:)``
/// says whether to continue at the partial file's length or start over.
public enum ResumeBook {
    /// The first line of every `.meta` record.
    static let recordHeader = "peerlink-partial 1"

    /// The base name of a transfer's partial files (add ``partSuffix`` or ``metaSuffix``):
    /// `.peerlink-<fingerprint>-<transfer id>`, hidden, and never a name
    /// ``ResourceName/sanitized(_:)`` produces (sanitised names never start with a dot).
    public static func partialName(sender: Fingerprint, transfer: TransferID) -> String {
        ".peerlink-\(sender.value)-\(transfer.hex)"
    }

    public static let partSuffix = ".part"
    public static let metaSuffix = ".meta"

    /// The `.meta` record of an offer: what a later re-offer must match to resume.
    public static func record(for offer: ResourceOffer) -> [UInt8] {
        let sha = offer.sha256.map { String($0, radix: 16).leftPadded(to: 2) }.joined()
        return Array("\(recordHeader)\nsize \(offer.size)\nsha256 \(sha)\n".utf8)
    }

    /// What to do with an offer, given the `.meta` record and the length of the `.part` file
    /// found for its (sender, transfer ID) — nil when there is none.
    public static func decide(offer: ResourceOffer, record: [UInt8]?, partialLength: UInt64?) -> ResumeDecision {
        guard let record, let partialLength else {
            return record == nil && partialLength == nil ? .fresh : .restart("the partial file or its record is missing")
        }
        guard record == self.record(for: offer) else {
            return .restart("the partial file belongs to another version of the file (size or SHA-256 differ)")
        }
        guard partialLength <= offer.size else {
            return .restart("the partial file is longer (\(partialLength) bytes) than the offered file (\(offer.size) bytes)")
        }
        return partialLength == 0 ? .fresh : .resume(at: partialLength)
    }
}

/// What a receiver does with an offer (``ResumeBook/decide(offer:record:partialLength:)``).
public enum ResumeDecision: Hashable, Sendable {
    /// Nothing kept: start at offset 0.
    case fresh
    /// Continue at this offset; the kept prefix is re-hashed first.
    case resume(at: UInt64)
    /// Something was kept but cannot be used (the reason says why): remove it, start at 0.
    case restart(String)

    /// The offset to answer the offer with.
    public var offset: UInt64 {
        if case .resume(let offset) = self { return offset }
        return 0
    }
}

/// The sender's side of resuming: how far the receiver has acknowledged, checked against the
/// file, so a re-offer after a lost link continues from there.
public struct SendLedger: Hashable, Sendable {
    public let size: UInt64
    /// The highest offset a receiver has accepted at (the bytes it holds durably).
    public private(set) var acknowledged: UInt64 = 0
    /// How many offers were answered (1 for a transfer that never needed resuming).
    public private(set) var attempts = 0

    public init(size: UInt64) {
        self.size = size
    }

    /// Records the receiver's `ACCEPT` offset and returns where to continue sending.
    ///
    /// - Throws: `unknown` when the offset lies past the end of the file (a receiver that
    ///   breaks the protocol).
    public mutating func accepted(at offset: UInt64) throws(PeerLinkError) -> UInt64 {
        guard offset <= size else {
            throw ResourceMessage.malformed("an accept at offset \(offset) of a \(size)-byte file")
        }
        attempts += 1
        acknowledged = offset
        return offset
    }
}
