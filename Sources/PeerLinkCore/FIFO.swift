/// A first-in-first-out queue whose `removeFirst` costs O(1) (amortised): a taken item's slot is
/// emptied at once (so a large element is freed when taken, not later), skipped by a head index,
/// and the storage is compacted once more than half of it is dead.
///
/// Public behind the `Runtime` SPI (for PeerLink's own modules, not API) and inlinable, so that
/// the modules using it specialise it for their element: as a `package` type its inlinable code
/// was not inlined into other modules (Swift 6.3), and every `append` and `removeFirst` there
/// looked up the generic metadata of `[Element?]` at run time (6 % of the CPU of a run of 64 B
/// messages, through the session's pair channels).
@_spi(Runtime)
public struct FIFO<Element: Sendable>: Sendable {
    @usableFromInline var storage: [Element?] = []
    @usableFromInline var head = 0

    @inlinable public init() {}

    @inlinable public var isEmpty: Bool { head == storage.count }
    @inlinable public var count: Int { storage.count - head }
    /// The queued items, oldest first.
    @inlinable public var items: [Element] { storage[head...].map { $0! } }

    @inlinable public mutating func append(_ element: Element) { storage.append(element) }

    /// The oldest item, without taking it.
    @inlinable public var first: Element? { head < storage.count ? storage[head] : nil }

    /// The element `offset` places after the first (0: the first).
    @inlinable public subscript(offset offset: Int) -> Element { storage[head + offset]! }

    /// Puts `element` before the first item: O(1) right after a ``removeFirst()`` (its slot is
    /// reused), O(n) once the storage was compacted.
    @inlinable public mutating func prepend(_ element: Element) {
        if head > 0 {
            head -= 1
            storage[head] = element
        } else {
            storage.insert(element, at: 0)
        }
    }

    @inlinable public mutating func removeFirst() -> Element? {
        guard head < storage.count else { return nil }
        // moved out of its slot (the slot left nil): no retain of the element and release of the slot
        let element = storage[head].take()
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

    /// Takes the items from the front while `predicate` holds for them, handing each to
    /// `removed` (moved out, not copied).
    @inlinable public mutating func removeFirst(while predicate: (Element) -> Bool, _ removed: (Element) -> Void) {
        while head < storage.count, predicate(storage[head]!) {
            removed(removeFirst()!)
        }
    }

    @inlinable public mutating func removeAll(where predicate: (Element) -> Bool) {
        storage = storage[head...].filter { !predicate($0!) }
        head = 0
    }

    /// Combines the queued items, oldest first, without copying them out.
    @inlinable public func reduce<Result>(_ initial: Result, _ next: (Result, Element) -> Result) -> Result {
        storage[head...].reduce(initial) { next($0, $1!) }
    }

    /// Combines the queued items, oldest first, into a result changed in place.
    @inlinable public func reduce<Result>(into initial: Result, _ next: (inout Result, Element) -> Void) -> Result {
        storage[head...].reduce(into: initial) { next(&$0, $1!) }
    }

    /// Applies `change` to every queued item in place.
    @inlinable public mutating func updateEach(_ change: (inout Element) -> Void) {
        for index in head..<storage.count { change(&storage[index]!) }
    }
}

extension Array {
    /// The element at `index`, moved out with `filler` left in its place: how a loop that uses
    /// up an array takes each element in order without copying it (a copy retains what the
    /// element holds, and freeing the array releases it again; `popLast()` after `reverse()`
    /// copies every element while reversing).
    @_spi(Runtime) @inlinable public mutating func take(at index: Int, leaving filler: Element) -> Element {
        var element = filler
        swap(&element, &self[index])
        return element
    }
}
