/// How far one transfer has come, as both the sender and the receiver report it.
public struct TransferProgress: Hashable, Sendable, CustomStringConvertible {
    /// Bytes of the file the receiver holds (including a prefix kept from an earlier attempt).
    public var bytesDone: UInt64
    public var total: UInt64
    /// Bytes per second over the last few seconds (0 until there are two samples).
    public var bytesPerSecond: Double
    /// Where the transfer started this time: above 0 when it resumed.
    public var resumedAt: UInt64

    public init(bytesDone: UInt64, total: UInt64, bytesPerSecond: Double, resumedAt: UInt64 = 0) {
        self.bytesDone = bytesDone
        self.total = total
        self.bytesPerSecond = bytesPerSecond
        self.resumedAt = resumedAt
    }

    /// 0...1; an empty file is 1 once done.
    public var fraction: Double { total == 0 ? 1 : Double(bytesDone) / Double(total) }

    /// Seconds until done at the current rate; nil while the rate is unknown.
    public var secondsRemaining: Double? {
        guard bytesPerSecond > 0 else { return nil }
        return Double(total - min(bytesDone, total)) / bytesPerSecond
    }

    public var description: String {
        "\(bytesDone)/\(total) bytes (\(Int(fraction * 100))%), \(Int(bytesPerSecond)) B/s"
    }
}

/// A transfer rate over a sliding window of samples, with time given by the caller (so tests
/// use any clock).
public struct RateMeter: Sendable {
    public let window: Duration
    private var samples: [(time: Duration, bytes: UInt64)] = []

    public init(window: Duration = .seconds(3)) {
        self.window = window
    }

    /// Records that `bytes` bytes were done in all at `time`; returns the rate in bytes per
    /// second between the oldest sample in the window and this one.
    public mutating func record(bytes: UInt64, at time: Duration) -> Double {
        samples.append((time, bytes))
        while samples.count > 2, let first = samples.first, time - first.time > window {
            samples.removeFirst()
        }
        guard let first = samples.first, time > first.time, bytes >= first.bytes else { return 0 }
        let seconds = Double((time - first.time).components.seconds) + Double((time - first.time).components.attoseconds) / 1e18
        return Double(bytes - first.bytes) / seconds
    }
}
