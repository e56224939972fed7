/// File names that arrive from a peer, made safe to create in a destination directory.
///
/// A peer chooses the name of a file it sends; the receiver must never let that name leave the
/// destination directory, hide the file, or smuggle terminal escapes into what it prints.
/// ``sanitized(_:)`` keeps the last path component (both `/` and `\` separate components),
/// replaces control and text-direction characters with `_`, drops leading dots (so neither `..`
/// nor a hidden file can result) and bounds the name to ``maximumBytes`` bytes of UTF-8 (keeping
/// a short extension). A name with nothing left becomes ``fallback``.
public enum ResourceName {
    /// The longest file name Linux file systems take, in bytes.
    public static let maximumBytes = 255
    /// The name used when nothing of the offered name is left.
    public static let fallback = "received-file"
    /// The longest extension kept when a name is shortened, in bytes (with its dot).
    static let maximumExtensionBytes = 16

    /// The safe form of `name` (see the type's description). Never empty, never `.` or `..`,
    /// never containing `/`, NUL or a control character, at most 255 bytes of UTF-8.
    public static func sanitized(_ name: String) -> String {
        // The last non-empty component, split at scalars: a separator followed by a combining
        // mark is one Character, and must still separate.
        var component = String.UnicodeScalarView()
        var last = String.UnicodeScalarView()
        for scalar in name.unicodeScalars {
            if scalar == "/" || scalar == "\\" {
                if !component.isEmpty { last = component }
                component = String.UnicodeScalarView()
            } else {
                component.append(isUnsafe(scalar) ? "_" : scalar)
            }
        }
        var cleaned = String(component.isEmpty ? last : component)
        while let first = cleaned.unicodeScalars.first, first == "." || first.properties.isWhitespace {
            cleaned.unicodeScalars.removeFirst()
        }
        while let last = cleaned.unicodeScalars.last, last.properties.isWhitespace {
            cleaned.unicodeScalars.removeLast()
        }
        if cleaned.isEmpty { return fallback }
        var result = bounded(cleaned, to: maximumBytes)
        while let last = result.unicodeScalars.last, last.properties.isWhitespace {
            result.unicodeScalars.removeLast()
        }
        return result.isEmpty ? fallback : result
    }

    /// The `number`th alternative to `name` for when a file of that name exists: `report.pdf` →
    /// `report (1).pdf`; still at most ``maximumBytes`` bytes.
    public static func alternative(to name: String, number: Int) -> String {
        let (stem, suffix) = split(name)
        let tag = " (\(number))"
        return bounded(stem, to: maximumBytes - tag.utf8.count - suffix.utf8.count) + tag + suffix
    }

    /// Characters a received file name must not contain: C0/C1 controls (NUL, escape, line
    /// breaks, DEL), and the format characters that reorder or hide text (bidi overrides,
    /// zero-width marks).
    static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .unassigned: return true
        default: return false
        }
    }

    /// `name` cut to at most `limit` bytes of UTF-8 on a character boundary, keeping a short
    /// extension.
    static func bounded(_ name: String, to limit: Int) -> String {
        guard name.utf8.count > limit else { return name }
        let (stem, suffix) = split(name)
        let keep = suffix.utf8.count <= maximumExtensionBytes ? suffix : ""
        var result = ""
        for character in stem {
            guard result.utf8.count + character.utf8.count + keep.utf8.count <= limit else { break }
            result.append(character)
        }
        return result.isEmpty ? String(fallback.prefix(limit)) : result + keep
    }

    /// The name before its last dot, and the dot with the extension (empty when there is none).
    static func split(_ name: String) -> (stem: String, suffix: String) {
        guard let dot = name.lastIndex(of: "."), dot != name.startIndex else { return (name, "") }
        return (String(name[..<dot]), String(name[dot...]))
    }
}
