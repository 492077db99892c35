// swift-tools-version:5.9
// HyFlash for Apple platforms: the speculative loop in pure Swift (HyFlashCore, testable with
// `swift test` anywhere Swift runs) and its Core ML backends (HyFlashCoreML, Apple only).
// The SwiftUI app (App/, project.yml) links both; README.md has the steps.
import PackageDescription

let package = Package(
    name: "HyFlash",
    platforms: [.iOS(.v17), .macOS(.v14)],
    products: [
        .library(name: "HyFlashCore", targets: ["HyFlashCore"]),
        .library(name: "HyFlashCoreML", targets: ["HyFlashCoreML"]),
    ],
    targets: [
        .target(name: "HyFlashCore"),
        .target(name: "HyFlashCoreML", dependencies: ["HyFlashCore"]),
        .testTarget(name: "HyFlashCoreTests", dependencies: ["HyFlashCore"]),
    ]
)
