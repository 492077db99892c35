import Foundation
import XCTest
@testable import HyFlashCore

/// manifest.json as `hyflash export --backend coreml` writes it (the fields the app binds).
final class BundleManifestTests: XCTestCase {
    func manifest(backend: String = "coreml", form: String = "static_io") -> [String: Any] {
        let contract: [String: Any] = ["file": "x.mlpackage", "inputs": [], "outputs": [],
                                       "commit_rows": 8]
        return [
            "format_version": 2, "backend": backend,
            "target": ["config": ["vocab_size": 4096, "max_seq_len": 128,
                                  "num_hidden_layers": 2, "eos_token_ids": [0]]],
            "drafter": ["config": ["block_size": 8, "feature_size": 768],
                        "state": [["name": "count", "input": "state_count",
                                   "output": "new_state_count", "shape": [1],
                                   "dtype": "int32"]]],
            "kv_cache": ["form": form, "dtype": "float16",
                         "past_inputs": "past_key_values_{layer}_{kind}",
                         "present_outputs": "present_{layer}_{kind}"],
            "models": ["target": contract, "drafter_step": contract,
                       "drafter_commit": contract.merging(["commit_rows": 64]) { $1 }],
        ]
    }

    func data(_ object: [String: Any]) throws -> Data {
        try JSONSerialization.data(withJSONObject: object)
    }

    func testReadsWhatTheLoopAndTheCoreMLBackendsBind() throws {
        let m = try BundleManifest.parse(try data(manifest()))
        XCTAssertEqual(m.vocabSize, 4096)
        XCTAssertEqual(m.maxSeqLen, 128)
        XCTAssertEqual(m.blockSize, 8)
        XCTAssertEqual(m.eosIds, [0])
        XCTAssertEqual(m.state.map { $0.input }, ["state_count"])
        XCTAssertEqual(m.pastInputs, ["past_key_values_0_key", "past_key_values_0_value",
                                      "past_key_values_1_key", "past_key_values_1_value"])
        XCTAssertEqual(m.presentOutputs.last, "present_1_value")
        XCTAssertEqual(m.rows["drafter_commit"], 64)
    }

    func testAnotherBackendOrAMissingFieldIsOneLineNamingIt() throws {
        XCTAssertThrowsError(try BundleManifest.parse(try data(manifest(backend: "onnx")))) {
            XCTAssertTrue("\($0)".contains("this bundle is for onnx, not coreml"))
        }
        var broken = manifest()
        broken["kv_cache"] = ["form": "state"]
        XCTAssertThrowsError(try BundleManifest.parse(try data(broken))) {
            XCTAssertTrue("\($0)".contains("kv_cache.past_inputs is missing"))
        }
        XCTAssertThrowsError(try BundleManifest.parse(Data("{".utf8))) {
            XCTAssertTrue("\($0)".contains("is not valid JSON"))
        }
    }
}
