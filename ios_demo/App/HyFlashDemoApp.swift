import SwiftUI

@main
struct HyFlashDemoApp: App {
    var body: some Scene {
        WindowGroup { ContentView() }
    }
}
