package org.dprec;

/**
 * The SDK's status codes (include/dprec/status.h): 0 is success, every error is negative, and a code is never
 * renumbered. {@link DprecException#status()} is one of these; {@link DprecException#statusName()} its name in C
 * ("DPREC_ERR_STORE_FULL"). The test suite checks every constant here against the native library's names.
 */
public final class Status {
    private Status() {
    }

    public static final int OK = 0;
    public static final int INVALID_ARGUMENT = -1;
    public static final int NO_MEMORY = -2;
    public static final int BUFFER_TOO_SMALL = -3;
    public static final int CONFIG = -4;
    public static final int STATE = -5;
    public static final int CRYPTO = -6;
    public static final int INTERNAL = -7;
    public static final int STRUCT_SIZE = -8;
    public static final int IO = -100;
    public static final int NOT_FOUND = -101;
    public static final int NO_SPACE = -102;
    public static final int ENTROPY = -103;
    public static final int PORT_MISSING = -104;
    public static final int ITEM_OUT_OF_RANGE = -200;
    public static final int VALUE_OUT_OF_SCALE = -201;
    public static final int VALUE_NOT_FINITE = -202;
    public static final int STORE_FULL = -203;
    public static final int NOT_RATED = -204;
    public static final int STORE_CORRUPT = -205;
    public static final int STORE_TRUNCATED = -206;
    public static final int STORE_VERSION = -207;
    public static final int STORE_KEY = -208;
    public static final int STORE_MISMATCH = -209;
    public static final int BAD_TIMESTAMP = -210;
    public static final int STORE_LOCKED = -211;
    public static final int RELEASE_MAGIC = -300;
    public static final int RELEASE_VERSION = -301;
    public static final int RELEASE_HEADER = -302;
    public static final int RELEASE_TRUNCATED = -303;
    public static final int RELEASE_TRAILING = -304;
    public static final int RELEASE_DIGEST = -305;
    public static final int RELEASE_VALUE = -306;
    public static final int RELEASE_SIGNATURE = -307;
    public static final int RELEASE_MISMATCH = -308;
    public static final int RELEASE_UNVERIFIED = -309;
    public static final int RELEASE_COLUMN = -310;
    public static final int SINGULAR = -400;
    public static final int NO_RATINGS = -401;
    public static final int BUDGET_EXCEEDED = -500;
    public static final int ALREADY_REPORTED = -501;
    public static final int NON_PRIVATE = -502;
    public static final int PENDING_FULL = -503;
    public static final int LEDGER_FULL = -504;
    public static final int LEDGER_LOST = -505;
    public static final int REPORT_TOO_LARGE = -506;
    public static final int JOB_CHANGED = -507;
    public static final int JOB_ROUNDS = -508;
    public static final int JOB_PARAMS = -509;
    public static final int NETWORK = -600;
    public static final int TLS = -601;
    public static final int PROTOCOL = -602;
    public static final int UNSUPPORTED = -603;
    public static final int ENROLLMENT = -604;
}
