import ArgumentParser
import Foundation
import PeerLink

struct Radios: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show network interfaces, the avahi-daemon and Bluetooth adapters.")

    @Flag(help: "Print one JSON object instead of text.")
    var json = false

    struct Report: Encodable {
        struct Bluetooth: Encodable {
            var available: Bool
            var problem: String?
            var adapters: [BluetoothAdapter]
            /// Whether bluetoothd answers on the system D-Bus (powered/discoverable/pairable come from it).
            var bluetoothd: Bool
            var bluetoothdProblem: String?
        }
        var interfaces: [NetworkInterface]
        var avahi: AvahiDaemonStatus
        var bluetooth: Bluetooth
    }

    func run() async throws {
        let interfaces = (try? NetworkInterface.all()) ?? []
        // avahi-daemon and bluetoothd are asked over D-Bus, whose calls block until they answer:
        // on a thread of their own, not one of Swift's cooperative threads.
        let avahi = await runBlocking("peerlink-radios") { AvahiDaemonStatus.query() }
        let bluetooth: Report.Bluetooth
        do {
            let (adapters, daemonProblem) = try await runBlocking("peerlink-radios") {
                () throws(PeerLinkError) -> ([BluetoothAdapter], String?) in try BluetoothAdapter.allWithDaemon()
            }
            bluetooth = Report.Bluetooth(available: true, problem: nil, adapters: adapters, bluetoothd: daemonProblem == nil, bluetoothdProblem: daemonProblem)
        } catch {
            bluetooth = Report.Bluetooth(available: false, problem: error.message, adapters: [], bluetoothd: false, bluetoothdProblem: nil)
        }
        let report = Report(interfaces: interfaces, avahi: avahi, bluetooth: bluetooth)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            printLine(String(decoding: try encoder.encode(report), as: UTF8.self))
            return
        }
        printLine("Network interfaces")
        let width = interfaces.map(\.name.count).max() ?? 0
        for interface in interfaces {
            var state = [interface.isUp ? "up" : "down"]
            if interface.isLoopback { state.append("loopback") }
            state.append(interface.supportsMulticast ? "multicast" : "no multicast")
            let addresses = interface.addresses.isEmpty ? "no address" : interface.addresses.joined(separator: " ")
            printLine("  \(interface.name.padding(toLength: width, withPad: " ", startingAt: 0))  \(state.joined(separator: ", ")): \(addresses)")
        }
        printLine("avahi-daemon")
        if avahi.running {
            printLine("  running, host name \(avahi.hostName ?? "?")\(avahi.version.map { " (\($0))" } ?? "")")
        } else {
            printLine("  not running: \(avahi.problem ?? "")")
        }
        printLine("Bluetooth")
        if !bluetooth.available {
            printLine("  \(bluetooth.problem ?? "unavailable")")
        } else if bluetooth.adapters.isEmpty {
            printLine("  no Bluetooth adapter found (plug one in, or check 'rfkill list')")
        } else {
            for adapter in bluetooth.adapters {
                var state = [adapter.isUp ? "up" : "down"]
                state.append([adapter.supportsBREDR ? "BR/EDR" : nil, adapter.supportsLE ? "LE" : nil].compactMap { $0 }.joined(separator: "+"))
                if adapter.isConnectable { state.append("connectable") }
                if adapter.isDiscoverable || adapter.discoverable == true { state.append("discoverable") }
                if adapter.isBlocked { state.append("blocked") }
                if let powered = adapter.powered { state.append(powered ? "powered" : "powered off") }
                if adapter.pairable == true { state.append("pairable") }
                let name = adapter.friendlyName.map { " \"\($0)\"" } ?? ""
                printLine("  \(adapter.name)  \(adapter.address)\(name)  \(state.joined(separator: ", "))")
                if let advice = adapter.unblockAdvice { printLine("    \(advice)") }
            }
            if let problem = bluetooth.bluetoothdProblem {
                printLine("  bluetoothd: \(problem)")
            } else {
                printLine("  bluetoothd: running")
            }
        }
    }
}
