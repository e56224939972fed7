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
        "\(partialPrefix)\(sender.value)-\(transfer.hex)"
    }

    /// How every partial file's name starts.
    public static let partialPrefix = ".peerlink-"

    public static let partSuffix = ".part"
    public static let metaSuffix = ".meta"

    /// The most unfinished transfers a receiver keeps in one directory from one sender, and from
    /// all senders together. Free space bounds their bytes; these bound their number, so a
    /// peer that starts offers and drops them (with one key or with a fresh key each time)
    /// cannot fill a directory with partial files. Starting a transfer beyond either removes
    /// the partial files that were left alone longest.
    public static let keptPerSender = 16
    public static let keptInDirectory = 64

    /// A transfer's partial files as found in a directory: their base name
    /// (``partialName(sender:transfer:)``), the sender's fingerprint, and when either file was
    /// last written (any clock, compared only with each other).
    public struct Kept: Hashable, Sendable {
        public let base: String
        public let sender: String
        public let modified: Int64

        public init(base: String, sender: String, modified: Int64) {
            self.base = base
            self.sender = sender
            self.modified = modified
        }
    }

    /// The base name and sender of a directory entry that is one of a transfer's partial files
    /// (`.peerlink-<fingerprint>-<32 hex digits>` with ``partSuffix`` or ``metaSuffix``); nil
    /// for any other name.
    public static func keptTransfer(named name: String) -> (base: String, sender: String)? {
        let base: Substring
        if name.hasSuffix(partSuffix) {
            base = name.dropLast(partSuffix.count)
        } else if name.hasSuffix(metaSuffix) {
            base = name.dropLast(metaSuffix.count)
        } else {
            return nil
        }
        guard base.hasPrefix(partialPrefix) else { return nil }
        let rest = base.dropFirst(partialPrefix.count).split(separator: "-", omittingEmptySubsequences: false)
        guard rest.count == 2, Fingerprint(String(rest[0]))?.value == String(rest[0]),
            rest[1].count == TransferID.byteCount * 2, rest[1].allSatisfy(\.isHexDigit)
        else { return nil }
        return (String(base), String(rest[0]))
    }

    /// The kept transfers to remove before the transfer with base name `base` from `sender`
    /// starts, so that with it at most ``keptPerSender`` of that sender's and
    /// ``keptInDirectory`` in all are kept: the ones left alone longest first, never one in
    /// `busy` (being received right now).
    public static func toRemove(beforeStarting base: String, from sender: String, kept: [Kept], busy: Set<String>) -> [String] {
        var byBase: [String: Kept] = [:]
        for entry in kept where entry.base != base {
            if let seen = byBase[entry.base], seen.modified >= entry.modified { continue }
            byBase[entry.base] = entry
        }
        let oldestFirst = byBase.values.sorted { ($0.modified, $0.base) < ($1.modified, $1.base) }
        var removed: [String] = []
        var senderCount = oldestFirst.count { $0.sender == sender }
        var total = oldestFirst.count
        for entry in oldestFirst where !busy.contains(entry.base) && entry.sender == sender && senderCount >= keptPerSender {
            removed.append(entry.base)
            senderCount -= 1
            total -= 1
        }
        for entry in oldestFirst where !busy.contains(entry.base) && !removed.contains(entry.base) && total >= keptInDirectory {
            removed.append(entry.base)
            total -= 1
        }
        return removed
    }

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
