package org.hyflash.demo

/** The bundle's tokenizer.json through ExecuTorch's tokenizer library (JNI). */
class Tokenizer(path: String) : AutoCloseable {
    private var handle: Long = TokenizerNative.open(path)

    fun encode(text: String): IntArray =
        TokenizerNative.encode(handle, text.toByteArray(Charsets.UTF_8))

    fun decode(ids: IntArray): String =
        String(TokenizerNative.decode(handle, ids), Charsets.UTF_8)

    override fun close() {
        if (handle != 0L) TokenizerNative.close(handle)
        handle = 0L
    }
}

/** Text crosses JNI as UTF-8 bytes (JNI strings are modified UTF-8). */
object TokenizerNative {
    init {
        System.loadLibrary("hyflash_jni")
    }

    @JvmStatic external fun open(path: String): Long

    @JvmStatic external fun encode(handle: Long, utf8: ByteArray): IntArray

    @JvmStatic external fun decode(handle: Long, ids: IntArray): ByteArray

    @JvmStatic external fun close(handle: Long)
}
