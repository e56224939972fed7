import Foundation
import PeerLinkCore
import PeerLinkPosix
import Testing

@Suite("Heap tuning: what glibc keeps of freed messages")
struct HeapTuningTests {
    /// The process's own choice leaves the heap alone: an opt-out, a glibc tunable or `MALLOC_*_`
    /// setting of its own, or the app's call; anything else is tuned.
    @Test func theProcessChoiceIsKept() {
        #expect(HeapTuning.reasonToLeave(environment: [:], kept: false) == nil)
        #expect(HeapTuning.reasonToLeave(environment: ["PEERLINK_HEAP_TUNING": "on", "GLIBC_TUNABLES": "glibc.rtld.x=1"], kept: false) == nil)
        #expect(HeapTuning.reasonToLeave(environment: ["MALLOC_ARENA_MAX": "2"], kept: false) == nil)
        for (environment, reason) in [
            (["PEERLINK_HEAP_TUNING": "off"], "PEERLINK_HEAP_TUNING=off"),
            (["PEERLINK_HEAP_TUNING": "0"], "PEERLINK_HEAP_TUNING=0"),
            (["GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"], "GLIBC_TUNABLES sets the heap"),
            (["MALLOC_TOP_PAD_": "1048576"], "MALLOC_TOP_PAD_ sets the heap"),
            (["MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_CHECK_": "3"], "MALLOC_CHECK_ sets the heap"),
        ] {
            #expect(HeapTuning.reasonToLeave(environment: environment, kept: false) == reason)
        }
        #expect(HeapTuning.reasonToLeave(environment: [:], kept: true)?.contains("keepDefaults") == true)
    }

    /// The first socket that waits starts the I/O thread, and the heap is tuned then (this test
    /// process sets no heap option of its own); asking again returns what was done.
    @Test func theFirstLinkTunesTheHeap() async throws {
        let listener = try TCPListener(host: "127.0.0.1")
        defer { listener.close() }
        let address = try #require(IPSocketAddress(host: "127.0.0.1", port: listener.port))
        async let accepted = listener.accept()
        let client = try await TCPConnection.connect(to: address, timeout: .seconds(5))
        defer { client.close() }
        let server = try await accepted
        defer { server.close() }
        // Nothing is written until the heap was tuned: the server's read has to park (the first
        // wait, unless an earlier test's link started the I/O thread already).
        async let read = server.read()
        let deadline = ContinuousClock.now + .seconds(10)
        while HeapTuning.outcome == nil, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
        try await client.write([1, 2, 3])
        #expect(try await read == [1, 2, 3])
        let outcome = try #require(HeapTuning.outcome)
        let environment = ProcessInfo.processInfo.environment
        if let reason = HeapTuning.reasonToLeave(environment: environment, kept: false) {
            #expect(outcome == .left(reason))
        } else if dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__asan_init") != nil {
            // AddressSanitizer's allocator replaces glibc's and takes no mallopt: said, not tuned
            // (Hardware/sanitizers.sh --address).
            #expect(outcome == .left("mallopt(M_MMAP_THRESHOLD) refused the setting"))
        } else {
            #expect(outcome == .tuned(topPad: HeapTuning.topPad, mmapThreshold: HeapTuning.mmapThreshold))
        }
        #expect(HeapTuning.apply() == outcome)
    }
}
