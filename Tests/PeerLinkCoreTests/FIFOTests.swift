import Testing

@_spi(Runtime) @testable import PeerLinkCore

/// The queue under a link's and a session's frames and messages, and taking elements out of an
/// array without copying them.
@Suite("FIFO and moving elements out")
struct FIFOTests {
    final class Box: Sendable {
        let value: Int
        init(_ value: Int) { self.value = value }
    }

    @Test("items come out in order, across the compaction of the storage, and prepend puts one back first")
    func order() {
        var queue = FIFO<Int>()
        for value in 0..<100 { queue.append(value) }
        var out: [Int] = []
        for _ in 0..<70 { out.append(queue.removeFirst()!) }
        queue.prepend(-1)
        #expect(queue.first == -1)
        while let value = queue.removeFirst() { out.append(value) }
        #expect(out == Array(0..<70) + [-1] + Array(70..<100))
        #expect(queue.isEmpty && queue.count == 0 && queue.removeFirst() == nil)
    }

    @Test("an item taken out is the caller's alone: the queue keeps no reference to it")
    func removeFirstMoves() {
        var queue = FIFO<Box>()
        queue.append(Box(1))
        queue.append(Box(2))
        var taken = queue.removeFirst()!
        #expect(isKnownUniquelyReferenced(&taken))
        #expect(queue.count == 1 && queue.first?.value == 2)
    }

    @Test("removeFirst(while:) takes the leading items that match, in order, and stops at the first that does not")
    func removeFirstWhile() {
        var queue = FIFO<Box>()
        for value in [1, 2, 3, 7, 4] { queue.append(Box(value)) }
        var removed: [Int] = []
        queue.removeFirst(while: { $0.value <= 3 }) { removed.append($0.value) }
        #expect(removed == [1, 2, 3])
        #expect(queue.items.map { $0.value } == [7, 4], "4 stays: the first that did not match ends it")
        queue.removeFirst(while: { _ in true }) { _ in }
        #expect(queue.isEmpty)
        queue.removeFirst(while: { _ in true }) { _ in Issue.record("nothing to remove") }
    }

    @Test("Array.take(at:leaving:) moves the element out and leaves the filler")
    func arrayTake() {
        var boxes = [Box(1), Box(2), Box(3)]
        let filler = Box(0)
        var taken = boxes.take(at: 1, leaving: filler)
        #expect(taken.value == 2)
        #expect(isKnownUniquelyReferenced(&taken), "the array kept no reference to it")
        #expect(boxes.map { $0.value } == [1, 0, 3])
    }
}
