// swift-tools-version:6.2
import PackageDescription

/// Warnings are errors in every target of this package (dependencies keep their own settings).
let strict: [SwiftSetting] = [.treatAllWarnings(as: .error)]

let package = Package(
    name: "PeerLink",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "PeerLink", targets: ["PeerLink"]),
        .library(name: "PeerLinkCore", targets: ["PeerLinkCore"]),
        .library(name: "PeerLinkTestSupport", targets: ["PeerLinkTestSupport"]),
        .executable(name: "peerlink", targets: ["peerlink"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.0.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
    ],
    targets: [
        // C libraries, wrapped at the edge. Imported with `internal import` only.
        .systemLibrary(
            name: "CAvahi",
            pkgConfig: "avahi-client",
            providers: [.apt(["libavahi-client-dev"])]
        ),
        .systemLibrary(
            name: "CBlueZ",
            pkgConfig: "bluez",
            providers: [.apt(["libbluetooth-dev"])]
        ),
        // bluetoothd's API (discovery, adapter properties, SDP records) is D-Bus: libdbus-1.
        .systemLibrary(
            name: "CDBus",
            pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]
        ),
        // epoll(7) from the C library's headers (not part of the Glibc module).
        .systemLibrary(name: "CEpoll"),
        // mallopt(3) from the C library's headers (not part of the Glibc module either).
        .systemLibrary(name: "CMalloc"),

        // Pure protocol logic: identity, validation, codecs, state machines. No C, no I/O.
        .target(
            name: "PeerLinkCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        // POSIX edge: every syscall the platform targets make, files, sockets, interfaces.
        .target(
            name: "PeerLinkPosix",
            dependencies: ["PeerLinkCore", "CEpoll", "CMalloc", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),
        // LAN transport: DNS-SD through avahi-daemon (libavahi-client), TCP.
        .target(
            name: "PeerLinkLAN",
            dependencies: [
                "PeerLinkCore", "PeerLinkPosix", "CAvahi",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Bluetooth Classic: BlueZ kernel sockets and HCI (libbluetooth), bluetoothd over D-Bus (libdbus-1).
        .target(
            name: "PeerLinkBluetooth",
            dependencies: [
                "PeerLinkCore", "PeerLinkPosix", "CBlueZ", "CDBus",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Links running: the link state machine driven over a LinkChannel. No sockets, no C.
        .target(
            name: "PeerLinkSession",
            dependencies: ["PeerLinkCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),
        // Files (resources) over streams: sender, receiver, resume, verification. File I/O here.
        .target(
            name: "PeerLinkFiles",
            dependencies: ["PeerLinkCore", "PeerLinkPosix", "PeerLinkSession", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        // For tests of code built on PeerLink: in-memory transport, manual clock, attackers.
        .target(
            name: "PeerLinkTestSupport",
            dependencies: ["PeerLinkCore", "PeerLinkPosix"],
            swiftSettings: strict
        ),
        // The public façade.
        .target(
            name: "PeerLink",
            dependencies: ["PeerLinkCore", "PeerLinkPosix", "PeerLinkLAN", "PeerLinkBluetooth", "PeerLinkSession", "PeerLinkFiles"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "peerlink",
            dependencies: [
                "PeerLink",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // The benchmark (not a test): sessions against raw sockets (TCP, RFCOMM, L2CAP), in one run.
        .executableTarget(
            name: "peerlink-bench",
            dependencies: [
                "PeerLink", "CBlueZ", .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // Fuzz targets for every decoder that reads bytes from the network or disk. Built normally
        // it replays inputs; built with -sanitize=fuzzer,address -DPEERLINK_FUZZING (Hardware/fuzz.sh)
        // it is libFuzzer itself. The normal build and tests never need libFuzzer.
        .executableTarget(
            name: "peerlink-fuzz",
            dependencies: ["PeerLinkCore", "PeerLinkPosix", "PeerLinkBluetooth"],
            swiftSettings: strict
        ),

        // Examples, built with everything else so they never rot.
        .target(
            name: "PeerLinkExampleSupport",
            dependencies: ["PeerLink", .product(name: "Logging", package: "swift-log")],
            path: "Examples/Support",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "peerlink-example-discover",
            dependencies: ["PeerLink"],
            path: "Examples/Discover",
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "peerlink-example-browsechat",
            dependencies: ["PeerLinkExampleSupport", "PeerLink", .product(name: "Logging", package: "swift-log")],
            path: "Examples/BrowseChat",
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "peerlink-example-counter",
            dependencies: ["PeerLinkExampleSupport", "PeerLink", .product(name: "Logging", package: "swift-log")],
            path: "Examples/Counter",
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "peerlink-example-automesh",
            dependencies: ["PeerLinkExampleSupport", "PeerLink", .product(name: "Logging", package: "swift-log")],
            path: "Examples/AutoMesh",
            exclude: ["README.md"],
            swiftSettings: strict
        ),

        .executableTarget(
            name: "peerlink-example-mpcchat",
            dependencies: ["PeerLinkExampleSupport", "PeerLink", .product(name: "Logging", package: "swift-log")],
            path: "Examples/MPCChat",
            exclude: ["README.md"],
            swiftSettings: strict
        ),

        .testTarget(
            name: "PeerLinkCoreTests",
            dependencies: ["PeerLinkCore", .product(name: "Crypto", package: "swift-crypto")],
            exclude: ["Vectors"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PeerLinkSessionTests",
            dependencies: [
                "PeerLinkSession", "PeerLinkTestSupport", "PeerLinkPosix",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PeerLinkFilesTests",
            dependencies: ["PeerLinkFiles", "PeerLinkPosix", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        // The node and the open transport set: endpoint schemes, ranking, transport choice, and
        // nodes over in-memory transports (no sockets, no daemons).
        .testTarget(
            name: "PeerLinkNodeTests",
            dependencies: ["PeerLink", "PeerLinkTestSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "PeerLinkIntegrationTests",
            dependencies: [
                "PeerLink", "PeerLinkLAN", "PeerLinkPosix", "PeerLinkBluetooth", "PeerLinkTestSupport",
                .product(name: "Crypto", package: "swift-crypto"), .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
    ]
)
