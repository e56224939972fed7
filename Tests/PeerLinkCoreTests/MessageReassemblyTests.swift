import PeerLinkCore
import Testing

@Suite("Reliable messages reassembled from their chunks")
struct MessageReassemblyTests {
    @Test func aMessageOfOneChunkIsThatChunk() {
        var reassembly = MessageReassembly()
        #expect(reassembly.add(id: 1, flags: [], chunk: [1, 2, 3]) == .complete([1, 2, 3]))
        #expect(reassembly.bufferedBytes == 0)
        #expect(reassembly.bufferCount == 0)
    }

    /// Chunks of three messages interleaved, of sizes around a frame's payload: each message is
    /// its chunks in order, and the bytes held count up and back to zero.
    @Test func interleavedMessagesAreTheirChunksInOrder() {
        var reassembly = MessageReassembly()
        let sizes = [1, WireFormat.maxFramePayload, 7, WireFormat.maxFramePayload - 1, 300, WireFormat.maxFramePayload, 2]
        var expected: [UInt32: [UInt8]] = [:]
        var completed: [UInt32: [UInt8]] = [:]
        var held = 0
        for (round, size) in sizes.enumerated() {
            for id: UInt32 in 1...3 {
                let chunk = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(id) &+ round) }
                expected[id, default: []] += chunk
                let last = round == sizes.count - 1
                switch reassembly.add(id: id, flags: last ? [] : .more, chunk: FramePayload(chunk)) {
                case .incomplete:
                    held += size
                    #expect(!last)
                case .complete(let bytes):
                    held -= expected[id]!.count - size
                    completed[id] = bytes
                case .tooLarge(let count):
                    Issue.record("\(count) bytes called too large")
                }
                #expect(reassembly.bufferedBytes == held)
            }
        }
        #expect(completed == expected)
        #expect(reassembly.bufferedBytes == 0)
        #expect(reassembly.bufferCount == 0)
    }

    /// A peer that sends a message as many one-byte chunks: they are merged into buffers of a
    /// frame's payload, not kept one small array each (which would cost tens of times the
    /// bytes the session's limits count).
    @Test func tinyChunksAreMerged() {
        var reassembly = MessageReassembly()
        let count = 3 * WireFormat.maxFramePayload
        for index in 0..<count {
            #expect(reassembly.add(id: 9, flags: .more, chunk: [UInt8(truncatingIfNeeded: index)]) == .incomplete)
        }
        #expect(reassembly.bufferedBytes == count)
        #expect(reassembly.bufferCount <= 3)
        let outcome = reassembly.add(id: 9, flags: [], chunk: [0xFF])
        #expect(outcome == .complete((0..<count).map { UInt8(truncatingIfNeeded: $0) } + [0xFF]))
    }

    @Test func aMessageOverTheLimitIsRefused() {
        var reassembly = MessageReassembly()
        let chunk = [UInt8](repeating: 0, count: WireFormat.maxFramePayload)
        let chunks = WireFormat.maxMessageLength / chunk.count
        for _ in 0..<chunks {
            #expect(reassembly.add(id: 4, flags: .more, chunk: FramePayload(chunk)) == .incomplete)
        }
        #expect(reassembly.add(id: 4, flags: [], chunk: [1]) == .tooLarge(WireFormat.maxMessageLength + 1))
        #expect(reassembly.bufferedBytes == 0)
    }

    /// Chunks that are parts of a received record (``RecordPin``) are kept as they are, and the
    /// record counts as its chunks' bytes while they make up at least half of it, all of it once
    /// they are less: a peer cannot keep whole records alive through a few bytes of each.
    @Test func chunksSharingARecordCountAsTheRecordOnceTheyHoldLessThanHalf() {
        var reassembly = MessageReassembly()
        let size = WireFormat.maxFramePayload
        let record = (0..<(3 * size + 60)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let pin = RecordPin(size: record.count)
        func part(_ index: Int) -> FramePayload { FramePayload(record[(20 + index * (size + 20))...].prefix(size), pinning: pin) }
        for id: UInt32 in 1...3 {
            #expect(reassembly.add(id: id, flags: .more, chunk: part(Int(id) - 1)) == .incomplete)
        }
        #expect(reassembly.bufferedBytes == 3 * size)
        #expect(reassembly.add(id: 1, flags: [], chunk: [1]) == .complete(part(0).array + [1]))
        #expect(reassembly.bufferedBytes == 2 * size)
        #expect(reassembly.add(id: 2, flags: [], chunk: [2]) == .complete(part(1).array + [2]))
        // one chunk of three left: the record is what it holds
        #expect(reassembly.bufferedBytes == record.count)
        // a second record's chunk for the same message: counted as its bytes (all of its record)
        let other = [UInt8](repeating: 9, count: size + 20)
        #expect(reassembly.add(id: 3, flags: .more, chunk: FramePayload(other[20...], pinning: RecordPin(size: other.count))) == .incomplete)
        #expect(reassembly.bufferedBytes == record.count + size)
        #expect(reassembly.add(id: 3, flags: [], chunk: [3]) == .complete(part(2).array + [UInt8](repeating: 9, count: size) + [3]))
        #expect(reassembly.bufferedBytes == 0)
        #expect(reassembly.bufferCount == 0)
    }

    /// A message over the limit is dropped with the records its chunks held.
    @Test func aMessageOverTheLimitReleasesItsRecords() {
        var reassembly = MessageReassembly()
        let record = [UInt8](repeating: 5, count: WireFormat.maxFramePayload + 20)
        let chunks = WireFormat.maxMessageLength / WireFormat.maxFramePayload
        for _ in 0..<chunks {
            let chunk = FramePayload(record[20...], pinning: RecordPin(size: record.count))
            #expect(reassembly.add(id: 4, flags: .more, chunk: chunk) == .incomplete)
        }
        #expect(reassembly.bufferedBytes == WireFormat.maxMessageLength)
        #expect(reassembly.add(id: 4, flags: [], chunk: [1]) == .tooLarge(WireFormat.maxMessageLength + 1))
        #expect(reassembly.bufferedBytes == 0)
    }
}
