import Foundation

/// The manifest.json fields a Core ML bundle's runtime binds (the format is defined once, in
/// Python: hyflash/bundle). Anything else in the file is ignored; a missing or mistyped
/// field is one HyFlashError naming it.
public struct BundleManifest {
    public struct StateSpec {
        public let name: String
        public let input: String
        public let output: String
        public let shape: [Int]
        public let dtype: String  // "float16" or "int32" in Core ML bundles
    }

    public let backend: String
    public let vocabSize: Int
    public let maxSeqLen: Int
    public let layers: Int
    public let eosIds: Set<Int32>
    public let blockSize: Int
    public let featureSize: Int
    public let state: [StateSpec]
    public let kvForm: String        // "state" (iOS 18) or "static_io"
    public let pastInputs: [String]  // static_io: the cache inputs, layer by layer, key then value
    public let presentOutputs: [String]
    public let files: [String: String]  // role -> package (target, drafter_step, drafter_commit)
    public let rows: [String: Int]      // role -> commit_rows

    public static func read(folder: URL) throws -> BundleManifest {
        let url = folder.appendingPathComponent("manifest.json")
        guard let data = try? Data(contentsOf: url) else {
            throw HyFlashError("no manifest.json in \(folder.path): not a hyflash bundle; write "
                + "one with `hyflash export --backend coreml` and copy the whole folder")
        }
        return try parse(data, source: url.lastPathComponent)
    }

    public static func parse(_ data: Data, source: String = "manifest.json") throws
        -> BundleManifest {
        guard let root = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw HyFlashError("\(source) is not valid JSON: the bundle is damaged; re-export it")
        }
        let m = Fields(root, source: source, path: "")
        let backend = try m.string("backend")
        guard backend == "coreml" else {
            throw HyFlashError("this bundle is for \(backend), not coreml: the iOS app runs Core "
                + "ML bundles (`hyflash export --backend coreml`)")
        }
        let target = try m.object("target").object("config")
        let drafter = try m.object("drafter")
        let dcfg = try drafter.object("config")
        let kv = try m.object("kv_cache")
        let layers = try target.int("num_hidden_layers")
        func names(_ pattern: String) -> [String] {
            (0..<layers).flatMap { i in
                ["key", "value"].map {
                    pattern.replacingOccurrences(of: "{layer}", with: String(i))
                        .replacingOccurrences(of: "{kind}", with: $0)
                }
            }
        }
        let models = try m.object("models")
        var files: [String: String] = [:], rows: [String: Int] = [:]
        for role in ["target", "drafter_step", "drafter_commit"] {
            let c = try models.object(role)
            files[role] = try c.string("file")
            rows[role] = try c.int("commit_rows")
        }
        return BundleManifest(
            backend: backend, vocabSize: try target.int("vocab_size"),
            maxSeqLen: try target.int("max_seq_len"), layers: layers,
            eosIds: Set(try target.ints("eos_token_ids").map { Int32($0) }),
            blockSize: try dcfg.int("block_size"), featureSize: try dcfg.int("feature_size"),
            state: try drafter.objects("state").map {
                StateSpec(name: try $0.string("name"), input: try $0.string("input"),
                          output: try $0.string("output"), shape: try $0.ints("shape"),
                          dtype: try $0.string("dtype"))
            },
            kvForm: try kv.string("form"), pastInputs: names(try kv.string("past_inputs")),
            presentOutputs: names(try kv.string("present_outputs")), files: files, rows: rows)
    }
}

/// Typed access that names the field of any problem.
private struct Fields {
    let dict: [String: Any]
    let source: String
    let path: String

    init(_ dict: [String: Any], source: String, path: String) {
        self.dict = dict
        self.source = source
        self.path = path
    }

    func at(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    func fail(_ key: String, _ problem: String) -> HyFlashError {
        HyFlashError("\(source): \(at(key)) \(problem): the bundle is damaged; re-export it")
    }

    func value(_ key: String) throws -> Any {
        guard let v = dict[key] else { throw fail(key, "is missing") }
        return v
    }

    func object(_ key: String) throws -> Fields {
        guard let d = try value(key) as? [String: Any] else { throw fail(key, "must be an object") }
        return Fields(d, source: source, path: at(key))
    }

    func objects(_ key: String) throws -> [Fields] {
        guard let a = try value(key) as? [[String: Any]] else {
            throw fail(key, "must be a list of objects")
        }
        return a.enumerated().map { Fields($1, source: source, path: "\(at(key))[\($0)]") }
    }

    func string(_ key: String) throws -> String {
        guard let s = try value(key) as? String else { throw fail(key, "must be a string") }
        return s
    }

    func int(_ key: String) throws -> Int {
        guard let n = try value(key) as? NSNumber, n.doubleValue == n.doubleValue.rounded() else {
            throw fail(key, "must be an integer")
        }
        return n.intValue
    }

    func ints(_ key: String) throws -> [Int] {
        guard let a = try value(key) as? [NSNumber] else {
            throw fail(key, "must be a list of integers")
        }
        return a.map { $0.intValue }
    }
}
