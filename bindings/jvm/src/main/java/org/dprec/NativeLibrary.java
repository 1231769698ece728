package org.dprec;

/**
 * Loads the JNI library once: the file named by the system property {@code dprec.jni.library} if set (a build
 * tree, a test), else {@code libdprec_jni} from the library path ({@code System.loadLibrary}; on Android, the APK's
 * jniLibs).
 */
final class NativeLibrary {
    private static boolean loaded;

    private NativeLibrary() {
    }

    static synchronized void load() {
        if (loaded) {
            return;
        }
        String path = System.getProperty("dprec.jni.library");
        if (path != null && !path.isEmpty()) {
            System.load(path);
        } else {
            System.loadLibrary("dprec_jni");
        }
        loaded = true;
    }
}
