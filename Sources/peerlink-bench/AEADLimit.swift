import Foundation
import PeerLinkCore

/// What one core seals with ChaCha20-Poly1305 when it does nothing else: 16 KiB records, a fresh
/// nonce each, sealed in place as a link seals its records (``NoiseCipherState``, swift-crypto's
/// cipher). The ceiling of an encrypted session's throughput on this machine.
enum AEADLimit {
    static let recordSize = 16 * 1024

    /// Bytes a second, sealing for about `seconds` (at least 64 records).
    static func measure(seconds: Double) throws -> Double {
        var cipher = try NoiseCipherState(key: (0..<32).map { UInt8($0) })
        var record = [UInt8](repeating: 0x3C, count: recordSize + 16)
        var sealed = 0
        var sink: UInt8 = 0
        let clock = ContinuousClock()
        let start = clock.now
        let limit = Duration.milliseconds(Int64(seconds * 1000))
        // Bounded in count as well as in time.
        for counter in 0..<(1 << 20) {
            // the record's plaintext where the last one's ciphertext was: sealed where it lies
            record.removeLast(16)
            try cipher.encryptWithAd([], inPlace: &record, from: 0)
            sink ^= record[recordSize]
            sealed += recordSize
            if counter >= 64, counter % 16 == 0, clock.now - start >= limit { break }
        }
        let elapsed = durationSeconds(clock.now - start)
        // Keeps the optimiser from dropping the work whose result is otherwise unused.
        if sink == 0x5A, elapsed < 0 { print("") }
        return Double(sealed) / elapsed
    }
}
