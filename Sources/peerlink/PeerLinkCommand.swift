import ArgumentParser
import Foundation
import PeerLink

@main
struct PeerLinkCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peerlink",
        abstract: "Find nearby peers and talk to them, over the LAN and Bluetooth.",
        discussion: """
            Exit codes:
              0   success
              1   an unexpected failure (the message says what happened)
              64  invalid input: a bad option, service type, name or --info (the message names the rule)
              69  a service or radio is unavailable: avahi-daemon not running, no Bluetooth, ...
            """,
        subcommands: [Radios.self, Advertise.self, Scan.self, Chat.self, Send.self, Receive.self]
    )

    static func main() async {
        // Resource limits (issue 11): every descriptor the system lets this process have, before
        // anything opens one (DescriptorLimit; the library does it too, with its first listener).
        DescriptorLimit.raiseSoftLimit()
        await main(nil)
    }
}

/// Exit statuses of the tool (sysexits.h numbers where one fits).
enum ExitStatus {
    static let failure: Int32 = 1
    static let usage: Int32 = 64
    static let unavailable: Int32 = 69

    static func code(for error: PeerLinkError) -> Int32 {
        switch error.code {
        case .invalidParameter: return usage
        case .unavailable, .unsupported: return unavailable
        default: return failure
        }
    }
}

/// Prints a PeerLink error the way every command does, and exits with its status.
func fail(_ error: PeerLinkError) -> ExitCode {
    printError("peerlink: \(error.message)")
    return ExitCode(ExitStatus.code(for: error))
}

func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Output that reaches the terminal or pipe at once, line by line.
func printLine(_ text: String = "") {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}
