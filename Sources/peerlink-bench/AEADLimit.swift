import Crypto
import Foundation

/// What one core seals with ChaCha20-Poly1305 when it does nothing else: 16 KiB records (the
/// size of a full PeerLink record), a fresh nonce each, with swift-crypto as the sessions use
/// it. The ceiling of an encrypted session's throughput on this machine.
enum AEADLimit {
    static let recordSize = 16 * 1024

    /// Bytes a second, sealing for about `seconds` (at least 64 records).
    static func measure(seconds: Double) throws -> Double {
        let key = SymmetricKey(size: .bits256)
        let record = [UInt8](repeating: 0x3C, count: recordSize)
        var nonce = [UInt8](repeating: 0, count: 12)
        var sealed = 0
        var sink: UInt8 = 0
        let clock = ContinuousClock()
        let start = clock.now
        let limit = Duration.milliseconds(Int64(seconds * 1000))
        // Bounded in count as well as in time.
        for counter in 0..<UInt64(1 << 20) {
            withUnsafeBytes(of: counter.littleEndian) { bytes in
                for index in 0..<8 { nonce[4 + index] = bytes[index] }
            }
            let box = try ChaChaPoly.seal(record, using: key, nonce: ChaChaPoly.Nonce(data: nonce))
            sink ^= box.tag.first ?? 0
            sealed += recordSize
            if counter >= 64, counter % 16 == 0, clock.now - start >= limit { break }
        }
        let elapsed = durationSeconds(clock.now - start)
        // Keeps the optimiser from dropping the work whose result is otherwise unused.
        if sink == 0x5A, elapsed < 0 { print("") }
        return Double(sealed) / elapsed
    }
}
