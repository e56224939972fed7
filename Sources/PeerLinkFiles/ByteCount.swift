import Foundation

/// A number of bytes as people read it in file messages: `512 B`, `1.5 KiB`, `2.0 MiB`, `3.1 GiB`.
public enum ByteCount {
    public static func text(_ count: UInt64) -> String {
        let value = Double(count)
        let kib = 1024.0
        if value >= kib * kib * kib { return String(format: "%.1f GiB", value / (kib * kib * kib)) }
        if value >= kib * kib { return String(format: "%.1f MiB", value / (kib * kib)) }
        if value >= kib { return String(format: "%.1f KiB", value / kib) }
        return "\(count) B"
    }
}
