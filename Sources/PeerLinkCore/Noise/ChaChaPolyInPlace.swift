import Crypto

#if canImport(CCryptoBoringSSL) && !PEERLINK_PORTABLE_AEAD
// swift-crypto's own BoringSSL, the code behind its `ChaChaPoly` on Linux: its AEAD seals and
// opens from one buffer into another (or the same one) with no intermediate buffers.
internal import CCryptoBoringSSL
#endif

/// ChaCha20-Poly1305 (RFC 8439) on the bytes of a record where they lie: sealed in place, opened
/// straight into the buffer that receives the plaintext.
///
/// swift-crypto's `ChaChaPoly` API returns a `SealedBox` whose ciphertext and tag are copied
/// into one new buffer, and opens into another new buffer: two copies and two allocations per
/// record around the cipher itself, about a sixth of a bulk transfer's sealing and opening time
/// (see the Performance article). Where swift-crypto is built on BoringSSL (every platform but
/// Apple's), this calls that AEAD directly; elsewhere it goes through `ChaChaPoly` and copies.
/// Both give the same bytes (the Noise test vectors run against whichever is built).
enum ChaChaPolyInPlace {
    static let tagLength = 16
    static let nonceLength = 12

    /// Seals `buffer[start...]` in place (the ciphertext replaces the plaintext) and appends
    /// the 16-byte tag. False, with `buffer` cut back to `start`, if the cipher failed.
    static func seal(_ buffer: inout [UInt8], from start: Int, key: SymmetricKey, nonce: UInt64, ad: [UInt8]) -> Bool {
        precondition(start >= 0 && start <= buffer.count, "the plaintext starts inside the buffer")
        #if canImport(CCryptoBoringSSL) && !PEERLINK_PORTABLE_AEAD
        let length = buffer.count - start
        buffer.append(contentsOf: repeatElement(0, count: tagLength))
        let sealed = withContext(key: key) { context in
            withNonce(nonce) { nonceBytes in
                ad.withUnsafeBufferPointer { adBytes in
                    buffer.withUnsafeMutableBufferPointer { bytes -> Bool in
                        let text = bytes.baseAddress! + start
                        var written = 0
                        // in and out alias exactly, which BoringSSL's AEADs allow
                        return CCryptoBoringSSL_EVP_AEAD_CTX_seal(
                            context, text, &written, length + tagLength, nonceBytes, nonceLength,
                            text, length, adBytes.baseAddress, adBytes.count) == 1 && written == length + tagLength
                    }
                }
            }
        }
        #else
        let sealed: Bool
        do {
            let box = try ChaChaPoly.seal(buffer[start...], using: key, nonce: chachaNonce(nonce), authenticating: ad)
            buffer.replaceSubrange(start..., with: box.ciphertext)
            buffer.append(contentsOf: box.tag)
            sealed = true
        } catch {
            sealed = false
        }
        #endif
        if !sealed { buffer.removeSubrange(start...) }
        return sealed
    }

    /// Opens `ciphertext` (ciphertext, then its tag) into `output`, which holds only the
    /// plaintext afterwards; its storage is reused, and it is not cleared first when it already
    /// has about the right size. False, with `output` empty, if the record does not authenticate.
    static func open(_ ciphertext: ArraySlice<UInt8>, into output: inout [UInt8], key: SymmetricKey, nonce: UInt64, ad: [UInt8]) -> Bool {
        guard ciphertext.count >= tagLength else {
            output.removeAll(keepingCapacity: true)
            return false
        }
        #if canImport(CCryptoBoringSSL) && !PEERLINK_PORTABLE_AEAD
        let length = ciphertext.count - tagLength
        func openInto(_ plaintext: UnsafeMutableBufferPointer<UInt8>) -> Bool {
            withContext(key: key) { context in
                withNonce(nonce) { nonceBytes in
                    ad.withUnsafeBufferPointer { adBytes in
                        ciphertext.withUnsafeBufferPointer { input in
                            var written = 0
                            return CCryptoBoringSSL_EVP_AEAD_CTX_open(
                                context, plaintext.baseAddress, &written, length, nonceBytes, nonceLength,
                                input.baseAddress, input.count, adBytes.baseAddress, adBytes.count) == 1 && written == length
                        }
                    }
                }
            }
        }
        let opened: Bool
        if output.isEmpty, output.capacity < length {
            // a new buffer (the last one is still shared, or there was none): the cipher is
            // what initializes it
            var succeeded = false
            output = [UInt8](unsafeUninitializedCapacity: length) { plaintext, initialized in
                succeeded = openInto(plaintext)
                // on failure none of it is kept
                initialized = succeeded ? length : 0
            }
            opened = succeeded
        } else {
            // the buffer kept from the last record, sized to this one: every byte is written
            // by the cipher
            if output.count > length {
                output.removeSubrange(length...)
            } else if output.count < length {
                output.append(contentsOf: repeatElement(0, count: length - output.count))
            }
            opened = output.withUnsafeMutableBufferPointer { openInto($0) }
        }
        #else
        output.removeAll(keepingCapacity: true)
        var opened = false
        if let box = try? ChaChaPoly.SealedBox(
            nonce: chachaNonce(nonce), ciphertext: ciphertext.dropLast(tagLength), tag: ciphertext.suffix(tagLength)),
            let plaintext = try? ChaChaPoly.open(box, using: key, authenticating: ad)
        {
            output.append(contentsOf: plaintext)
            opened = true
        }
        #endif
        if !opened { output.removeAll(keepingCapacity: true) }
        return opened
    }

    #if canImport(CCryptoBoringSSL) && !PEERLINK_PORTABLE_AEAD
    /// A context for `key`, set up on the stack for one call (for ChaCha20-Poly1305 that is a
    /// copy of the key) and wiped afterwards.
    private static func withContext(key: SymmetricKey, _ body: (UnsafePointer<EVP_AEAD_CTX>) -> Bool) -> Bool {
        var context = EVP_AEAD_CTX()
        defer { CCryptoBoringSSL_EVP_AEAD_CTX_cleanup(&context) }
        let ready = key.withUnsafeBytes { keyBytes in
            CCryptoBoringSSL_EVP_AEAD_CTX_init(
                &context, CCryptoBoringSSL_EVP_aead_chacha20_poly1305(),
                keyBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), keyBytes.count, tagLength, nil) == 1
        }
        guard ready else { return false }
        return withUnsafePointer(to: &context) { body($0) }
    }

    /// The 96-bit nonce of `n` on the stack: 4 zero bytes, then `n` little-endian.
    private static func withNonce(_ n: UInt64, _ body: (UnsafePointer<UInt8>) -> Bool) -> Bool {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: nonceLength) { bytes in
            bytes.initialize(repeating: 0)
            for index in 0..<8 { bytes[4 + index] = UInt8(truncatingIfNeeded: n >> (8 * UInt64(index))) }
            return body(UnsafePointer(bytes.baseAddress!))
        }
    }
    #else
    /// The 96-bit nonce of `n` as swift-crypto takes it.
    private static func chachaNonce(_ n: UInt64) throws -> ChaChaPoly.Nonce {
        var bytes = [UInt8](repeating: 0, count: nonceLength)
        for index in 0..<8 {
            bytes[4 + index] = UInt8(truncatingIfNeeded: n >> (8 * UInt64(index)))
        }
        return try ChaChaPoly.Nonce(data: bytes)
    }
    #endif
}
