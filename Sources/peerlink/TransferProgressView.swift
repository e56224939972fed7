import Foundation
import PeerLink

/// Shows one transfer's progress: a redrawn bar with rate and ETA on a terminal, plain lines
/// (at most one a second, and one at the end) otherwise.
struct TransferProgressView: Sendable {
    /// Redraw one bar in place (a terminal) or print lines.
    let bar: Bool
    /// Where plain lines go.
    let output: @Sendable (String) -> Void

    /// Follows `transfer` until it ends; returns how it ended.
    func follow(_ transfer: FileTransfer, label: String, started: () -> Void = {}) async -> Result<TransferOutcome, TransferFailure> {
        let clock = ContinuousClock()
        var lastLine = clock.now - .seconds(10)
        var lastPercent = -1
        var first = true
        let failure = await Self.drain(transfer.updates) { progress in
            if first {
                first = false
                started()
            }
            if bar {
                // Redrawn at most ten times a second, and at the end.
                let percent = Int(progress.fraction * 1000)
                guard percent != lastPercent, clock.now - lastLine >= .milliseconds(100) || progress.bytesDone == progress.total
                else { return }
                lastPercent = percent
                lastLine = clock.now
                FileHandle.standardOutput.write(Data(("\r" + Self.barLine(label, progress) + "\u{1B}[K").utf8))
            } else if clock.now - lastLine >= .seconds(1) || progress.bytesDone == progress.total {
                lastLine = clock.now
                output(Self.plainLine(label, progress))
            }
        }
        if bar { FileHandle.standardOutput.write(Data("\n".utf8)) }
        if let failure { return .failure(failure) }
        return await transfer.result()
    }

    static func drain(_ updates: TransferUpdates, _ body: (TransferProgress) -> Void) async -> TransferFailure? {
        do throws(TransferFailure) {
            for try await progress in updates { body(progress) }
            return nil
        } catch {
            return error
        }
    }

    static func barLine(_ label: String, _ progress: TransferProgress) -> String {
        let width = 24
        let filled = Int(progress.fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let eta = progress.secondsRemaining.map { " ETA \(duration($0))" } ?? ""
        return "\(label) [\(bar)] \(Int(progress.fraction * 100))% \(bytes(progress.bytesDone))/\(bytes(progress.total)) \(rate(progress.bytesPerSecond))\(eta)"
    }

    static func plainLine(_ label: String, _ progress: TransferProgress) -> String {
        let eta = progress.secondsRemaining.map { ", ETA \(duration($0))" } ?? ""
        let resumed = progress.resumedAt > 0 ? ", resumed at \(progress.resumedAt)" : ""
        return "\(label): \(Int(progress.fraction * 100))% (\(progress.bytesDone)/\(progress.total) bytes), \(rate(progress.bytesPerSecond))\(eta)\(resumed)"
    }

    static func bytes(_ count: UInt64) -> String { ByteCount.text(count) }

    static func rate(_ bytesPerSecond: Double) -> String { bytes(UInt64(max(0, bytesPerSecond))) + "/s" }

    static func duration(_ seconds: Double) -> String {
        let total = Int(seconds.rounded(.up))
        return total >= 3600 ? String(format: "%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60)
            : String(format: "%d:%02d", total / 60, total % 60)
    }
}
