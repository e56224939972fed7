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
        }
        var interfaces: [NetworkInterface]
        var avahi: AvahiDaemonStatus
        var bluetooth: Bluetooth
    }

    func run() async throws {
        let interfaces = (try? NetworkInterface.all()) ?? []
        let avahi = AvahiDaemonStatus.query()
        let bluetooth: Report.Bluetooth
        do {
            bluetooth = Report.Bluetooth(available: true, problem: nil, adapters: try BluetoothAdapter.all())
        } catch {
            bluetooth = Report.Bluetooth(available: false, problem: error.message, adapters: [])
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
                if adapter.isDiscoverable { state.append("discoverable") }
                if adapter.isBlocked { state.append("blocked") }
                let name = adapter.friendlyName.map { " \"\($0)\"" } ?? ""
                printLine("  \(adapter.name)  \(adapter.address)\(name)  \(state.joined(separator: ", "))")
                if let advice = adapter.unblockAdvice { printLine("    \(advice)") }
            }
        }
    }
}
