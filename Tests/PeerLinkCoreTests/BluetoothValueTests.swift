import PeerLinkCore
import Testing

@Suite("Bluetooth addresses, channels and PSMs")
struct BluetoothValueTests {
    @Test("addresses parse in either case and print upper case, most significant byte first")
    func addresses() throws {
        let address = try #require(BluetoothAddress("00:aa:01:00:00:0f"))
        #expect(address.bytes == [0x00, 0xAA, 0x01, 0x00, 0x00, 0x0F])
        #expect(address.description == "00:AA:01:00:00:0F")
        #expect(BluetoothAddress("00-AA-01-00-00-0F") == address)
        for bad in ["", "00:AA:01:00:00", "00:AA:01:00:00:00:00", "0:AA:01:00:00:00", "00:AG:01:00:00:00", "00:AA:01:00:00:+1", "00AA01000000"] {
            #expect(BluetoothAddress(bad) == nil, "\(bad)")
        }
        #expect(BluetoothAddress(bytes: [1, 2, 3]) == nil)
        #expect(BluetoothAddress.any.description == "00:00:00:00:00:00")
    }

    @Test("RFCOMM channels are 1 to 30")
    func channels() {
        #expect(RFCOMMChannel(0) == nil)
        #expect(RFCOMMChannel(1)?.value == 1)
        #expect(RFCOMMChannel(30)?.value == 30)
        #expect(RFCOMMChannel(31) == nil)
        #expect(RFCOMMChannel(-1) == nil)
    }

    @Test("PSMs are odd in the low byte and even in the high byte; 0x1001 and up are dynamic", arguments: [
        (0x0001, true, false), (0x0003, true, false), (0x1001, true, true), (0x1003, true, true), (0xFEFF, true, true),
        (0x0000, false, false), (0x1000, false, false), (0x0101, false, false), (0x1101, false, false), (0x10000, false, false),
    ])
    func psms(value: Int, valid: Bool, dynamic: Bool) {
        let psm = L2CAPPSM(value)
        #expect((psm != nil) == valid)
        #expect((psm?.isDynamic ?? false) == dynamic)
    }

    @Test("PSMs parse from hex and decimal and print as four hex digits")
    func psmText() {
        #expect(L2CAPPSM("0x1001")?.value == 0x1001)
        #expect(L2CAPPSM("4097")?.value == 0x1001)
        #expect(L2CAPPSM("0X0003")?.description == "0x0003")
        #expect(L2CAPPSM("0x1000") == nil)
        #expect(L2CAPPSM("banana") == nil)
    }
}
