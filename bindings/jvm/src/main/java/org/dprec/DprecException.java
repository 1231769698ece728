package org.dprec;

/**
 * An SDK call failed: {@link #status()} is the negative dprec_status code (the constants of {@link Status}), and the
 * message is its name and the SDK's own description, e.g. "DPREC_ERR_STORE_FULL: the rating store is full".
 * Unchecked, so that Kotlin and Java callers handle it where they can act on it.
 */
public class DprecException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final int status;

    public DprecException(int status) {
        super(nativeStatusName(status) + ": " + nativeStrerror(status));
        this.status = status;
    }

    public DprecException(int status, String context) {
        super(context + ": " + nativeStatusName(status) + ": " + nativeStrerror(status));
        this.status = status;
    }

    /** The dprec_status code, one of {@link Status}'s constants. */
    public int status() {
        return status;
    }

    /** The code's name in C, "DPREC_ERR_..." ("DPREC_UNKNOWN" for a code this library does not know). */
    public String statusName() {
        return nativeStatusName(status);
    }

    /** The name of a status code, as dprec_status_name. */
    public static String nameOf(int status) {
        return nativeStatusName(status);
    }

    static native String nativeStatusName(int status);

    static native String nativeStrerror(int status);

    static {
        NativeLibrary.load();
    }
}
