import Foundation
import PeerLinkCore
import PeerLinkPosix
import Testing

@testable import PeerLinkBluetooth

/// What runs without Bluetooth hardware: socket address layouts, address byte order, and the
/// messages socket errors become.
@Suite("Bluetooth sockets: layouts and error messages")
struct BluetoothSocketUnitTests {
    @Test func socketAddressLayoutsMatchTheKernel() {
        // sockaddr_rc: family (2), bdaddr (6), channel (1), padded to 10
        #expect(BTSocket.rfcommAddressSize == 10)
        // sockaddr_l2: family (2), PSM (2), bdaddr (6), CID (2), address type (1), padded to 14
        #expect(BTSocket.l2capAddressSize == 14)
    }

    @Test func addressBytesAreReversedForTheKernel() throws {
        let address = try #require(BluetoothAddress("00:AA:01:02:03:04"))
        let kernel = withUnsafeBytes(of: address.bdaddr) { Array($0) }
        #expect(kernel == [0x04, 0x03, 0x02, 0x01, 0xAA, 0x00])
        #expect(BluetoothAddress(address.bdaddr) == address)
    }

    static let endpoint = Endpoint.l2cap(address: BluetoothAddress("00:AA:01:00:00:00")!, psm: L2CAPPSM(0x1001)!)

    @Test func refusedSaysNothingListensThere() {
        let error = BluetoothErrors.dial(
            SystemError("connect", errno: ECONNREFUSED), endpoint: Self.endpoint, kind: .l2cap, port: 0x1001, adapter: .any,
            timeout: .seconds(5))
        #expect(error.code == .unavailable)
        #expect(error.message.contains("nothing listens on L2CAP PSM 0x1001 at 00:AA:01:00:00:00"), "\(error.message)")
    }

    @Test(arguments: [EHOSTDOWN, EHOSTUNREACH])
    func unreachableSaysOutOfRange(_ code: Int32) {
        let error = BluetoothErrors.dial(
            SystemError("connect", errno: code), endpoint: Self.endpoint, kind: .l2cap, port: 0x1001, adapter: .any,
            timeout: .seconds(5))
        #expect(error.message.contains("not in range or not connectable"), "\(error.message)")
    }

    @Test func timeoutNamesTheTime() {
        let error = BluetoothErrors.dial(
            SystemError("connect", errno: ETIMEDOUT), endpoint: Self.endpoint, kind: .l2cap, port: 0x1001, adapter: .any,
            timeout: .milliseconds(2500))
        #expect(error.code == .timedOut)
        #expect(error.message.contains("within 2.5 s"), "\(error.message)")
    }

    @Test func privilegedPSMSaysUseADynamicOne() {
        let error = BluetoothErrors.listen(SystemError("bind", errno: EACCES), kind: .l2cap, adapter: .any, port: 0x0003)
        #expect(error.message.contains("CAP_NET_BIND_SERVICE"), "\(error.message)")
        #expect(error.message.contains("dynamic PSM"), "\(error.message)")
    }

    @Test(arguments: [EADDRINUSE, EBUSY])
    func takenChannelSaysChooseAnother(_ code: Int32) {
        let error = BluetoothErrors.listen(SystemError("bind", errno: code), kind: .rfcomm, adapter: .any, port: 5)
        #expect(error.message.contains("RFCOMM channel 5"), "\(error.message)")
        #expect(error.message.contains("already taken"), "\(error.message)")
    }

    @Test func noBluetoothInTheKernelSaysLoadTheModule() {
        let error = BluetoothErrors.listen(SystemError("socket", errno: EAFNOSUPPORT), kind: .rfcomm, adapter: .any, port: 0)
        #expect(error.code == .unsupported)
        #expect(error.message.contains("modprobe bluetooth"), "\(error.message)")
    }

    @Test(arguments: [ENODEV, ENETDOWN])
    func adapterDownSaysPowerItOn(_ code: Int32) {
        let error = BluetoothErrors.dial(
            SystemError("connect", errno: code), endpoint: Self.endpoint, kind: .l2cap, port: 0x1001, adapter: .any,
            timeout: .seconds(5))
        #expect(error.message.contains("bluetoothctl power on"), "\(error.message)")
        #expect(error.message.contains("rfkill unblock bluetooth"), "\(error.message)")
    }

    @Test func theBluetoothTransportDialsOnlyBluetoothEndpoints() async {
        let error = await #expect(throws: PeerLinkError.self) {
            _ = try await BluetoothTransport().dial(.tcp(host: "127.0.0.1", port: 1), timeout: .seconds(1))
        }
        #expect(error?.code == .unsupported)
    }

    @Test(.enabled(if: !BluetoothLab.kernelHasBluetooth, "this kernel has Bluetooth"))
    func withoutBluetoothInTheKernelListeningIsOneClearError() {
        let error = #expect(throws: PeerLinkError.self) { try BluetoothTransportListener(.l2cap).close() }
        #expect(error?.code == .unsupported)
        #expect(error?.message.contains("this kernel has no Bluetooth") == true, "\(String(describing: error))")
    }
}
