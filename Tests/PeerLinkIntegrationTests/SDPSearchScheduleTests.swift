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
