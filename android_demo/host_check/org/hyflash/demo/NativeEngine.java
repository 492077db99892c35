package org.hyflash.demo;

/**
 * The JVM face of app/src/main/java/org/hyflash/demo/NativeEngine.kt for the host check:
 * the same class name and static native methods, so the host JVM binds the same JNI
 * symbols the app binds (tests/test_native.py checks the two declare the same methods).
 */
public final class NativeEngine {
    static {
        System.loadLibrary("hyflash_jni");
    }

    private NativeEngine() {}

    public static native long open(String bundle, int threads);

    public static native String generate(long handle, int[] prompt, int maxNewTokens,
                                         boolean draft);

    public static native void close(long handle);
}
