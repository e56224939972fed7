/// Text a peer chose (a refusal's reason, a `GO_AWAY` reason, a stream reset's reason, a file
/// transfer's reason), made safe to print on a terminal and to write to a log.
///
/// A hostile peer's text could otherwise move the cursor, rewrite the line above (`CR`), set
/// the window title or a hyperlink (`ESC ]`, OSC), change colours or clear the screen
/// (`ESC [`, CSI, also as the single C1 byte U+009B), or reverse what follows it (bidi
/// overrides), for instance to print a fake `* mallory joined` line. ``sanitized(_:limit:)``
/// escapes every such character so it shows as visible text, and cuts the result.
public enum PeerText {
    /// Reasons are sanitised and cut to this many bytes where they are decoded (verdicts,
    /// `GO_AWAY` frames, stream resets, resource messages), whatever the wire allowed; a
    /// session cuts them further to ``ResourceLimits/maximumReasonBytes`` before logging them.
    public static let decodedReasonBytes = 1024

    /// What is added where text was cut.
    public static let ellipsis = "…"

    /// `text` with every character that could act on a terminal or a log escaped, cut to at
    /// most `limit` bytes of UTF-8 (an ``ellipsis`` inside them marks a cut).
    ///
    /// Escaped: the backslash (`\\`, so an escape cannot be faked), `\n`, `\r`, `\t`, every
    /// other C0 control and DEL, the C1 controls U+0080–U+009F, the line and paragraph
    /// separators, and the text-direction marks, embeddings, overrides and isolates (U+061C,
    /// U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) — as `\u{1B}`-style escapes. Everything
    /// else, letters of every script included, is kept.
    public static func sanitized(_ text: String, limit: Int) -> String {
        var escapedText = ""
        var bytes = 0
        for scalar in text.unicodeScalars {
            let piece = escaped(scalar)
            escapedText += piece
            bytes += piece.utf8.count
            if bytes > limit { break }  // enough to know it is cut
        }
        return cut(escapedText, limit: limit)
    }

    /// `text` cut at a Unicode scalar to at most `limit` bytes of UTF-8, an ``ellipsis`` (inside
    /// the limit) marking the cut; unchanged when it fits. For text already sanitised: cutting
    /// never makes an escape sequence.
    public static func cut(_ text: String, limit: Int) -> String {
        guard text.utf8.count > limit else { return text }
        let room = limit - ellipsis.utf8.count
        guard room >= 0 else { return "" }
        var result = String.UnicodeScalarView()
        var bytes = 0
        for scalar in text.unicodeScalars {
            let width = UTF8.width(scalar)
            if bytes + width > room { break }
            result.append(scalar)
            bytes += width
        }
        return String(result) + ellipsis
    }

    /// ``sanitized(_:limit:)`` of bytes that should be UTF-8: invalid sequences become U+FFFD.
    public static func sanitized(bytes: some Collection<UInt8>, limit: Int) -> String {
        // Never decode more than the limit could show (4 bytes of input give at least 1 of output).
        sanitized(String(decoding: bytes.prefix(max(limit, 0) * 4 + 4), as: UTF8.self), limit: limit)
    }

    /// Whether `scalar` is shown escaped.
    public static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x5C, 0x7F...0x9F: true
        case 0x061C, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    private static func escaped(_ scalar: Unicode.Scalar) -> String {
        guard needsEscape(scalar) else { return String(scalar) }
        switch scalar {
        case "\\": return "\\\\"
        case "\n": return "\\n"
        case "\r": return "\\r"
        case "\t": return "\\t"
        default: return "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
        }
    }
}
