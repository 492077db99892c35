package org.hyflash.demo;

/**
 * Runs the demo's JNI layer on the host JVM, as MainActivity calls it:
 * java -Djava.library.path=DIR org.hyflash.demo.HostCheck BUNDLE 1,2,3 MAX_NEW [--no-draft]
 * prints NativeEngine.generate's JSON, or "error: <message>" and exits 2 when the native
 * side threw (the app shows that message).
 */
public final class HostCheck {
    private HostCheck() {}

    public static void main(String[] args) {
        String[] parts = args[1].split(",");
        int[] ids = new int[parts.length];
        for (int i = 0; i < parts.length; i++) {
            ids[i] = Integer.parseInt(parts[i].trim());
        }
        boolean draft = args.length < 4 || !args[3].equals("--no-draft");
        try {
            long engine = NativeEngine.open(args[0], 1);
            try {
                System.out.println(
                    NativeEngine.generate(engine, ids, Integer.parseInt(args[2]), draft));
            } finally {
                NativeEngine.close(engine);
            }
        } catch (IllegalArgumentException e) {
            System.out.println("error: " + e.getMessage());
            System.exit(2);
        }
    }
}
