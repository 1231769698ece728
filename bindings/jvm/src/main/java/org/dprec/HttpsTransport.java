package org.dprec;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.util.ArrayList;
import java.util.List;

import javax.net.ssl.HttpsURLConnection;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509TrustManager;

/**
 * A {@link Transport} over the platform's {@link HttpsURLConnection} (the JDK's, or Android's): HTTPS only, no
 * redirects, no caching, the body streamed to the SDK. By default it trusts the platform's CA store; {@link
 * #pinned(String, byte[], String)} adds a pin of the server's public key, as the C transports take it (the SHA-256 of
 * its SubjectPublicKeyInfo, "sha256//..." as {@code STATE/tls-pin.txt} holds it), which survives a renewed certificate
 * over the same key; {@link #trusting(String, byte[])} trusts only the given certificate(s).
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
     * for an aggregator with its own certificate, e.g. the self-signed {@code STATE/tls-cert.pem} it generates. The
     * certificate is then the trust anchor, and a new one breaks the app: prefer {@link #pinned}, which pins the key
     * as the C transports do.
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

    /**
     * To {@code baseUrl}, trusting a server only when its certificate's public key is one of {@code pins}: "sha256//"
     * and the base64 of the SHA-256 of the key's DER SubjectPublicKeyInfo, several joined with ';', whitespace around
     * each ignored (so {@code STATE/tls-pin.txt} or the aggregator's logged pin can be passed as they are), checked in
     * addition to the certificate chain, as the C transports check it: against {@code certificatesPem} (e.g. the
     * aggregator's self-signed {@code STATE/tls-cert.pem}) or, when null, the platform's CAs. A key that matches no
     * pin fails the handshake (an {@link javax.net.ssl.SSLException}: {@code Status.TLS}) before a byte of a request
     * is sent. IllegalArgumentException for a malformed pin.
     */
    public static HttpsTransport pinned(String baseUrl, byte[] certificatesPem, String pins)
            throws GeneralSecurityException {
        List<byte[]> digests = parsePins(pins);
        KeyStore ks = null;
        if (certificatesPem != null) {
            ks = KeyStore.getInstance(KeyStore.getDefaultType());
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
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks); /* null: the platform's CAs */
        X509TrustManager chain = null;
        for (TrustManager tm : tmf.getTrustManagers()) {
            if (tm instanceof X509TrustManager) {
                chain = (X509TrustManager) tm;
            }
        }
        if (chain == null) {
            throw new GeneralSecurityException("the platform has no X.509 trust manager");
        }
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, new TrustManager[] {new PinningTrustManager(chain, digests)}, null);
        return new HttpsTransport(baseUrl, ctx.getSocketFactory());
    }

    /* "sha256//<44 base64 characters>[;...]" into the 32-byte digests; whitespace around each pin ignored. */
    static List<byte[]> parsePins(String pins) {
        if (pins == null) {
            throw new IllegalArgumentException("no pin: pass the aggregator's sha256//... (STATE/tls-pin.txt)");
        }
        List<byte[]> out = new ArrayList<byte[]>();
        for (String p : pins.split(";")) {
            String t = p.trim();
            if (t.isEmpty()) {
                continue;
            }
            byte[] d = null;
            if (t.startsWith("sha256//") && t.length() == 8 + 44) {
                d = base64Decode32(t.substring(8));
            }
            if (d == null || d.length != 32) {
                throw new IllegalArgumentException("a pin is sha256// and the base64 of 32 bytes, not \"" + t + "\"");
            }
            out.add(d);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("no pin in \"" + pins + "\"");
        }
        return out;
    }

    private static final String B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /* 44 characters of standard base64 (one '=') into 32 bytes, or null; java.util.Base64 needs Android API 26. */
    private static byte[] base64Decode32(String s) {
        if (s.length() != 44 || s.charAt(43) != '=') {
            return null;
        }
        byte[] out = new byte[32];
        int acc = 0, bits = 0, o = 0;
        for (int i = 0; i < 43; i++) {
            int v = B64.indexOf(s.charAt(i));
            if (v < 0) {
                return null;
            }
            acc = (acc << 6) | v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                if (o < 32) {
                    out[o++] = (byte) (acc >> bits);
                }
                acc &= (1 << bits) - 1;
            }
        }
        return o == 32 && acc == 0 ? out : null;
    }

    private static String base64(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < b.length; i += 3) {
            int n = (b[i] & 0xff) << 16 | (i + 1 < b.length ? (b[i + 1] & 0xff) << 8 : 0)
                    | (i + 2 < b.length ? b[i + 2] & 0xff : 0);
            sb.append(B64.charAt(n >> 18 & 63)).append(B64.charAt(n >> 12 & 63));
            sb.append(i + 1 < b.length ? B64.charAt(n >> 6 & 63) : '=').append(i + 2 < b.length ? B64.charAt(n & 63) : '=');
        }
        return sb.toString();
    }

    /* The chain checked as the platform (or the given CAs) checks it, then the leaf's key against the pins. */
    private static final class PinningTrustManager implements X509TrustManager {
        private final X509TrustManager chain;
        private final List<byte[]> pins;

        PinningTrustManager(X509TrustManager chain, List<byte[]> pins) {
            this.chain = chain;
            this.pins = pins;
        }

        @Override
        public void checkClientTrusted(X509Certificate[] certs, String authType) throws CertificateException {
            throw new CertificateException("a device transport does not authenticate clients");
        }

        @Override
        public void checkServerTrusted(X509Certificate[] certs, String authType) throws CertificateException {
            chain.checkServerTrusted(certs, authType);
            byte[] spki = certs[0].getPublicKey().getEncoded(); /* the DER SubjectPublicKeyInfo */
            byte[] digest;
            try {
                digest = MessageDigest.getInstance("SHA-256").digest(spki);
            } catch (GeneralSecurityException e) {
                throw new CertificateException(e);
            }
            for (byte[] p : pins) {
                if (MessageDigest.isEqual(p, digest)) {
                    return;
                }
            }
            throw new CertificateException("the server's public key matches no pinned key (its pin: sha256//"
                                           + base64(digest) + ")");
        }

        @Override
        public X509Certificate[] getAcceptedIssuers() {
            return chain.getAcceptedIssuers();
        }
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
