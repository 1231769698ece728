package org.dprec;

/**
 * An SDK call failed: {@link #status()} is the negative dprec_status code (the constants of {@link Status}), and the
 * message is its name, the SDK's own description and the detail of this failure, e.g. "sync job 99:
 * DPREC_ERR_PROTOCOL: the aggregator refused the request or answered something malformed (GET /v1/jobs/99: HTTP 404
 * not_found: unknown job)". Unchecked, so that Kotlin and Java callers handle it where they can act on it.
 *
 * <p>The detail is the SDK's (dprec_client_last_error_info, docs/sdk.md "Errors"): for a sync, the HTTP status of
 * the answer that refused it and the aggregator's error code and message, or the transport's exception for a request
 * that got no answer; for the SDK's own refusals, which cause it is (a stream left open, a predict before a fit, the
 * store held by another client). A failed sync also carries its {@link #syncResult()}, whose outcome says whether to
 * try again.
 */
public class DprecException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final int status;
    private final String detail;
    private final int httpStatus;
    private final String serverCode;
    private final transient DprecClient.SyncResult syncResult;

    public DprecException(int status) {
        this(status, null);
    }

    public DprecException(int status, String context) {
        this(status, context, "", 0, "", null);
    }

    DprecException(int status, String context, String detail, int httpStatus, String serverCode,
                   DprecClient.SyncResult syncResult) {
        super((context != null ? context + ": " : "") + nativeStatusName(status) + ": " + nativeStrerror(status)
              + (detail != null && !detail.isEmpty() ? " (" + detail + ")" : ""));
        this.status = status;
        this.detail = detail != null ? detail : "";
        this.httpStatus = httpStatus;
        this.serverCode = serverCode != null ? serverCode : "";
        this.syncResult = syncResult;
    }

    /** The dprec_status code, one of {@link Status}'s constants. */
    public int status() {
        return status;
    }

    /** The code's name in C, "DPREC_ERR_..." ("DPREC_UNKNOWN" for a code this library does not know). */
    public String statusName() {
        return nativeStatusName(status);
    }

    /** What exactly went wrong, as dprec_client_last_error_detail gives it ("" if the SDK knows nothing more). */
    public String detail() {
        return detail;
    }

    /** For a sync: the HTTP status of the answer that refused it, 0 if none did (no answer, or not a sync). */
    public int httpStatus() {
        return httpStatus;
    }

    /** For a sync: the aggregator's error code from its answer ("not_found"), "" if none. */
    public String serverCode() {
        return serverCode;
    }

    /** For a failed {@link DprecClient#sync}: what it says to do next (outcome FAILED: do not retry on a timer;
     *  RETRY_LATER: the device's own storage failed, try again after the backoff). null for other calls. */
    public DprecClient.SyncResult syncResult() {
        return syncResult;
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
