import PeerLinkCore
import Testing

@testable import PeerLinkBluetooth

/// Which devices a Bluetooth browsing round asks for PeerLink records: every round those that
/// published one, less and less often those that never did.
@Suite("Bluetooth browsing: which devices a round asks (SDP)")
struct SDPSearchScheduleTests {
    static let phone = BluetoothDevice(address: BluetoothAddress("00:AA:01:00:00:07")!, name: "phone", deviceClass: 0x5a020c)
    static let laptop = BluetoothDevice(address: BluetoothAddress("00:AA:01:00:00:08")!, name: "laptop", deviceClass: 0x10010c)

    /// The rounds in 1...`through` that ask `device`, which never publishes a record.
    static func roundsAsked(_ device: BluetoothDevice, through last: Int, schedule: inout SDPSearchSchedule) -> [Int] {
        var asked: [Int] = []
        for round in 1...last where schedule.shouldSearch(device, round: round) {
            asked.append(round)
            schedule.searched(device, published: false, round: round)
        }
        return asked
    }

    @Test func aDeviceWithoutARecordIsAskedLessAndLessOftenThenEverySixRounds() {
        var schedule = SDPSearchSchedule()
        #expect(schedule.shouldSearch(Self.phone, round: 0), "a device seen for the first time is asked")
        schedule.searched(Self.phone, published: false, round: 0)
        // after 2 rounds, then 4, then every 6
        #expect(Self.roundsAsked(Self.phone, through: 30, schedule: &schedule) == [2, 6, 12, 18, 24, 30])
    }

    @Test func aDeviceThatPublishedARecordIsAskedEveryRoundEvenAfterItsPeerLeft() {
        var schedule = SDPSearchSchedule()
        schedule.searched(Self.laptop, published: true, round: 0)
        for round in 1...10 {
            #expect(schedule.shouldSearch(Self.laptop, round: round))
            // its peer stopped at round 3: the rounds that follow must see it gone, and back
            schedule.searched(Self.laptop, published: round < 3, round: round)
        }
    }

    @Test func aNewNameOrClassIsAskedAtOnce() {
        var schedule = SDPSearchSchedule()
        schedule.searched(Self.phone, published: false, round: 0)
        #expect(!schedule.shouldSearch(Self.phone, round: 1))
        var renamed = Self.phone
        renamed.name = "phone (PeerLink)"
        #expect(schedule.shouldSearch(renamed, round: 1))
        var reclassed = Self.phone
        reclassed.deviceClass = 0x10010c
        #expect(schedule.shouldSearch(reclassed, round: 1))
        // a device that starts publishing is asked every round from then on
        schedule.searched(renamed, published: true, round: 1)
        #expect(schedule.shouldSearch(renamed, round: 2) && schedule.shouldSearch(Self.phone, round: 2))
        // other devices keep their own schedule
        #expect(schedule.shouldSearch(Self.laptop, round: 2))
    }

    @Test func aNameOrClassNotReadInOneRoundIsNoChange() {
        var schedule = SDPSearchSchedule()
        var unnamed = Self.phone
        unnamed.name = nil
        unnamed.deviceClass = nil
        schedule.searched(unnamed, published: false, round: 0)
        #expect(!schedule.shouldSearch(Self.phone, round: 1), "its name and class were read after the search")
        schedule.saw(Self.phone)
        #expect(!schedule.shouldSearch(unnamed, round: 1), "a round that could not read them")
        var renamed = Self.phone
        renamed.name = "phone 2"
        #expect(schedule.shouldSearch(renamed, round: 1), "the name learnt meanwhile tells a change")
    }

    @Test func aCrowdOfMadeUpAddressesIsBounded() {
        var schedule = SDPSearchSchedule()
        for index in 0..<(SDPSearchSchedule.capacity + 200) {
            let bytes = withUnsafeBytes(of: UInt32(index).bigEndian) { Array($0) }
            let device = BluetoothDevice(address: BluetoothAddress(bytes: [0x02, 0x00] + bytes)!)
            schedule.searched(device, published: false, round: index)
        }
        #expect(schedule.remembered <= SDPSearchSchedule.capacity)
        // the last one is remembered: not asked again the next round
        let bytes = withUnsafeBytes(of: UInt32(SDPSearchSchedule.capacity + 199).bigEndian) { Array($0) }
        let last = BluetoothDevice(address: BluetoothAddress(bytes: [0x02, 0x00] + bytes)!)
        #expect(!schedule.shouldSearch(last, round: SDPSearchSchedule.capacity + 200))
    }
}

/// How a Bluetooth browser rests between rounds while its adapter holds a connection (an
/// inquiry takes the radio from every link the adapter holds).
@Suite("Bluetooth browsing: rests between rounds while the adapter holds a connection")
struct BrowsingRestTests {
    /// Answers `counts` in turn, then the last one for good; counts the looks.
    final class Adapter: @unchecked Sendable {
        private var counts: [Int?]
        private(set) var looks = 0
        init(_ counts: [Int?]) { self.counts = counts }
        func connections() -> Int? {
            looks += 1
            return counts.count > 1 ? counts.removeFirst() : counts.first ?? nil
        }
    }

    @Test("no connection, or a count that cannot be read: the next round runs at once")
    func noRestWithoutAConnection() async {
        for counts: [Int?] in [[0], [nil]] {
            let adapter = Adapter(counts)
            let rested = await BluetoothBrowser.rest(upTo: .seconds(15), step: .milliseconds(5)) { adapter.connections() }
            #expect(rested == .zero)
            #expect(adapter.looks == 1)
        }
    }

    @Test("a connection that lasts: the rest ends at its limit")
    func restEndsAtItsLimit() async {
        let adapter = Adapter([1])
        let rested = await BluetoothBrowser.rest(upTo: .milliseconds(50), step: .milliseconds(20)) { adapter.connections() }
        #expect(rested == .milliseconds(50), "20 + 20 + the 10 left")
        #expect(adapter.looks == 3)
    }

    @Test("the adapter's last connection goes: the rest ends at the next look")
    func restEndsWhenTheLastConnectionGoes() async {
        let adapter = Adapter([2, 1, 1, 0])
        let rested = await BluetoothBrowser.rest(upTo: .seconds(15), step: .milliseconds(5)) { adapter.connections() }
        #expect(rested == .milliseconds(15))
        #expect(adapter.looks == 4)
    }

    @Test("by default a browser rests at most three rounds' time; a rest can be chosen, never below zero")
    func defaultRest() {
        let type = ServiceType.default
        #expect(BluetoothBrowser(serviceType: type).restWhileConnected == .seconds(15))
        #expect(BluetoothBrowser(serviceType: type, roundDuration: .seconds(2)).restWhileConnected == .seconds(6))
        #expect(BluetoothBrowser(serviceType: type, restWhileConnected: .zero).restWhileConnected == .zero)
        #expect(BluetoothBrowser(serviceType: type, restWhileConnected: .seconds(-1)).restWhileConnected == .zero)
    }

    @Test("the kernel's count for an adapter that does not exist is none (no rest)")
    func countOfAMissingAdapter() {
        #expect(BTSys.connectionCount(adapter: "hci99") == nil)
    }
}
