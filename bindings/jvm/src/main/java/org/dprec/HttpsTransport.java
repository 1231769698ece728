package org.dprec;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;

import javax.net.ssl.HttpsURLConnection;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManagerFactory;

/**
 * A {@link Transport} over the platform's {@link HttpsURLConnection} (the JDK's, or Android's): HTTPS only, no
 * redirects, no caching, the body streamed to the SDK. By default it trusts the platform's CA store; {@link
 * #trusting(String, byte[])} trusts only the given certificate(s) instead — the aggregator's own
 * {@code STATE/tls-cert.pem} for a self-signed aggregator, which pins it.
 */
public final class HttpsTransport implements Transport {
    private final String baseUrl;
    private final SSLSocketFactory sockets; /* null: the platform's default */
    private int connectTimeoutMillis = 10000;
    private int readTimeoutMillis = 60000;

    private HttpsTransport(String baseUrl, SSLSocketFactory sockets) {
        if (baseUrl == null || !baseUrl.startsWith("https://")) {
            throw new IllegalArgumentException("the aggregator's URL must be https://");
        }
        String b = baseUrl;
        while (b.endsWith("/")) {
            b = b.substring(0, b.length() - 1);
        }
        this.baseUrl = b;
        this.sockets = sockets;
    }

    /** To {@code baseUrl} ("https://host:port"), trusting the platform's certificate authorities. */
    public static HttpsTransport to(String baseUrl) {
        return new HttpsTransport(baseUrl, null);
    }

    /**
     * To {@code baseUrl}, trusting only the certificates in {@code certificatesPem} (PEM or DER X.509, one or more):
     * for an aggregator with its own certificate, e.g. the self-signed {@code STATE/tls-cert.pem} it generates.
     */
    public static HttpsTransport trusting(String baseUrl, byte[] certificatesPem) throws GeneralSecurityException {
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        try {
            ks.load(null, null);
        } catch (IOException e) {
            throw new GeneralSecurityException(e);
        }
        int n = 0;
        for (Certificate c : CertificateFactory.getInstance("X.509")
                                               .generateCertificates(new ByteArrayInputStream(certificatesPem))) {
            ks.setCertificateEntry("dprec-" + n++, c);
        }
        if (n == 0) {
            throw new GeneralSecurityException("no certificate in the given bytes");
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        return new HttpsTransport(baseUrl, ctx.getSocketFactory());
    }

    /** Timeouts of a connection and of each read (defaults 10 s and 60 s). */
    public HttpsTransport timeouts(int connectMillis, int readMillis) {
        this.connectTimeoutMillis = connectMillis;
        this.readTimeoutMillis = readMillis;
        return this;
    }

    @Override
    public Response request(String method, String path, String bearer, String contentType, byte[] requestBody,
                            OutputStream body) throws IOException {
        HttpsURLConnection c = (HttpsURLConnection) new URL(baseUrl + path).openConnection();
        try {
            if (sockets != null) {
                c.setSSLSocketFactory(sockets);
            }
            c.setInstanceFollowRedirects(false);
            c.setUseCaches(false);
            c.setConnectTimeout(connectTimeoutMillis);
            c.setReadTimeout(readTimeoutMillis);
            c.setRequestMethod(method);
            c.setRequestProperty("User-Agent", "dprec-jvm/" + DprecClient.version());
            if (bearer != null) {
                c.setRequestProperty("Authorization", "Bearer " + bearer);
            }
            if (requestBody != null) {
                c.setDoOutput(true);
                c.setFixedLengthStreamingMode(requestBody.length);
                if (contentType != null) {
                    c.setRequestProperty("Content-Type", contentType);
                }
                OutputStream out = c.getOutputStream();
                try {
                    out.write(requestBody);
                } finally {
                    out.close();
                }
            }
            int status = c.getResponseCode();
            int retryAfter = 0;
            String ra = c.getHeaderField("Retry-After");
            if (ra != null) {
                try {
                    retryAfter = Math.max(0, Integer.parseInt(ra.trim()));
                } catch (NumberFormatException e) {
                    retryAfter = 0; /* an HTTP date: the SDK's own backoff applies */
                }
            }
            InputStream in = status >= HttpURLConnection.HTTP_BAD_REQUEST ? c.getErrorStream() : c.getInputStream();
            if (in != null) {
                try {
                    byte[] buf = new byte[16384];
                    int n;
                    while ((n = in.read(buf)) >= 0) {
                        body.write(buf, 0, n);
                    }
                } finally {
                    in.close();
                }
            }
            return new Response(status, retryAfter);
        } finally {
            c.disconnect();
        }
    }
}
