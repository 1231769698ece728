package org.dprec;

import java.io.IOException;
import java.io.OutputStream;

/**
 * How {@link DprecClient#sync} reaches the aggregator: one HTTPS request at a time, on the calling thread. An app
 * uses {@link HttpsTransport} or brings its own (OkHttp, Cronet, ...). The SDK builds every request; the transport only
 * carries it, and must not follow redirects or retry by itself (the SDK decides when to try again).
 */
public interface Transport {
    /** The answer to one request: its HTTP status and its Retry-After header in seconds (0 if absent). */
    final class Response {
        public final int status;
        public final int retryAfterSeconds;

        public Response(int status, int retryAfterSeconds) {
            this.status = status;
            this.retryAfterSeconds = retryAfterSeconds;
        }
    }

    /**
     * Performs one request and writes the response body, whatever the status, to {@code body} as it arrives (a
     * release is streamed: do not buffer it). {@code path} is relative to the aggregator's base URL
     * ("/v1/jobs/7"); {@code bearer} is the device token or null; {@code contentType} and {@code requestBody} are
     * null for a GET. A write to {@code body} may throw an IOException when the SDK refuses what arrives: let it
     * end the request. Throw an {@link IOException} when no response arrived (connection, DNS, timeout), a
     * {@link javax.net.ssl.SSLException} when the server failed certificate verification or pinning.
     */
    Response request(String method, String path, String bearer, String contentType, byte[] requestBody,
                     OutputStream body) throws IOException;
}
