/// A first-in-first-out queue whose `removeFirst` costs O(1) (amortised): a taken item's slot is
/// emptied at once (so a large element is freed when taken, not later), skipped by a head index,
/// and the storage is compacted once more than half of it is dead.
package struct FIFO<Element: Sendable>: Sendable {
    private var storage: [Element?] = []
    private var head = 0

    package init() {}

    package var isEmpty: Bool { head == storage.count }
    package var count: Int { storage.count - head }
    /// The queued items, oldest first.
    package var items: [Element] { storage[head...].map { $0! } }

    package mutating func append(_ element: Element) { storage.append(element) }

    /// The oldest item, without taking it.
    package var first: Element? { head < storage.count ? storage[head] : nil }

    /// The element `offset` places after the first (0: the first).
    package subscript(offset offset: Int) -> Element { storage[head + offset]! }

    package mutating func removeFirst() -> Element? {
        guard head < storage.count else { return nil }
        let element = storage[head]
        storage[head] = nil
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 32, head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }

    package mutating func removeAll(where predicate: (Element) -> Bool) {
        storage = storage[head...].filter { !predicate($0!) }
        head = 0
    }

    /// Combines the queued items, oldest first, without copying them out.
    package func reduce<Result>(_ initial: Result, _ next: (Result, Element) -> Result) -> Result {
        storage[head...].reduce(initial) { next($0, $1!) }
    }

    /// Combines the queued items, oldest first, into a result changed in place.
    package func reduce<Result>(into initial: Result, _ next: (inout Result, Element) -> Void) -> Result {
        storage[head...].reduce(into: initial) { next(&$0, $1!) }
    }

    /// Applies `change` to every queued item in place.
    package mutating func updateEach(_ change: (inout Element) -> Void) {
        for index in head..<storage.count { change(&storage[index]!) }
    }
}
