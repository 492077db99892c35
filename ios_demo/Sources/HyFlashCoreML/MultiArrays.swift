#if canImport(CoreML)
import Accelerate
import CoreML
import HyFlashCore

/// MLMultiArray <-> [Float] for the packages' float16 / float32 / int32 tensors. vImage
/// converts float16 on every Apple platform (Swift's Float16 is missing on Intel Macs), and
/// reads follow the array's strides: Core ML may pad an output's rows.
enum MultiArrays {
    static func make(_ shape: [Int], _ dtype: String) throws -> MLMultiArray {
        let type: MLMultiArrayDataType
        switch dtype {
        case "float16": type = .float16
        case "float32": type = .float32
        case "int32": type = .int32
        default: throw HyFlashError("a Core ML tensor of dtype \(dtype): re-export the bundle")
        }
        let array = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: type)
        array.withUnsafeMutableBytes { raw, _ in
            _ = raw.initializeMemory(as: UInt8.self, repeating: 0)  // not zeroed by Core ML
        }
        return array
    }

    static func int32(_ values: [Int32], shape: [Int]) throws -> MLMultiArray {
        let array = try make(shape, "int32")
        array.withUnsafeMutableBytes { raw, _ in
            let p = raw.bindMemory(to: Int32.self)
            for (i, v) in values.enumerated() { p[i] = v }
        }
        return array
    }

    /// A [rows, width] float16 array holding values (row-major, zero-padded to rows).
    static func float16(_ values: ArraySlice<Float>, rows: Int, width: Int) throws -> MLMultiArray {
        let array = try make([rows, width], "float16")
        array.withUnsafeMutableBytes { raw, strides in
            let rowBytes = strides[0] * 2  // strides in elements, as [Int]
            var src = Array(values)
            let filled = src.count / width
            src.withUnsafeMutableBytes { s in
                var from = vImage_Buffer(data: s.baseAddress, height: vImagePixelCount(filled),
                                         width: vImagePixelCount(width), rowBytes: width * 4)
                var to = vImage_Buffer(data: raw.baseAddress, height: vImagePixelCount(filled),
                                       width: vImagePixelCount(width), rowBytes: rowBytes)
                if filled > 0 { vImageConvert_PlanarFtoPlanar16F(&from, &to, 0) }
            }
        }
        return array
    }

    /// The first `rows` rows of the last two dims of a [.., R, width] array, as Float.
    static func floats(_ array: MLMultiArray, rows: Int, width: Int) throws -> [Float] {
        let rank = array.shape.count
        let rowStride = rank >= 2 ? array.strides[rank - 2].intValue : width
        guard array.strides[rank - 1].intValue == 1, array.shape[rank - 1].intValue == width
        else {
            throw HyFlashError("a Core ML output has shape \(array.shape), expected rows of "
                + "\(width): the package does not match the manifest; re-export the bundle")
        }
        var out = [Float](repeating: 0, count: rows * width)
        array.withUnsafeBytes { raw in
            out.withUnsafeMutableBytes { dst in
                switch array.dataType {
                case .float16:
                    var from = vImage_Buffer(data: UnsafeMutableRawPointer(mutating:
                                                 raw.baseAddress!),
                                             height: vImagePixelCount(rows),
                                             width: vImagePixelCount(width),
                                             rowBytes: rowStride * 2)
                    var to = vImage_Buffer(data: dst.baseAddress, height: vImagePixelCount(rows),
                                           width: vImagePixelCount(width), rowBytes: width * 4)
                    vImageConvert_Planar16FtoPlanarF(&from, &to, 0)
                default:  // float32
                    let src = raw.bindMemory(to: Float.self)
                    let d = dst.bindMemory(to: Float.self)
                    for r in 0..<rows {
                        for c in 0..<width { d[r * width + c] = src[r * rowStride + c] }
                    }
                }
            }
        }
        return out
    }
}
#endif
