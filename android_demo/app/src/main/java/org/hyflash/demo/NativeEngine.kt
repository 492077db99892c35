package org.hyflash.demo

/**
 * The C++ runtime (runtime_native/) over JNI: open a bundle folder, generate greedily with
 * speculative decoding, close. [generate] returns JSON: `{"tokens": [...], "stats": {...}}`
 * with the stats of `hyflash-run --json` (tau, acceptance_rates, tokens_per_s, ...).
 * Every problem arrives as an IllegalArgumentException with a one-line message.
 */
object NativeEngine {
    init {
        System.loadLibrary("hyflash_jni")
    }

    @JvmStatic external fun open(bundle: String, threads: Int): Long

    @JvmStatic external fun generate(
        handle: Long, prompt: IntArray, maxNewTokens: Int, draft: Boolean,
    ): String

    @JvmStatic external fun close(handle: Long)
}
