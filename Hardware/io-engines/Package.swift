// swift-tools-version:6.2
// The I/O engine comparison (Hardware/io-engines.sh): PeerLink's own reactor (Readiness on epoll)
// against SwiftNIO's, and both against blocking sockets, over loopback TCP in one run. A package of
// its own so that the project itself does not depend on SwiftNIO: only this measurement builds it.
import PackageDescription

let package = Package(
    name: "io-engines",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "PeerLink", path: "../.."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
    ],
    targets: [
        .executableTarget(
            name: "io-engines",
            dependencies: [
                .product(name: "PeerLink", package: "PeerLink"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: [.treatAllWarnings(as: .error)]
        )
    ]
)
