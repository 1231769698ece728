package org.dprec;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The Java binding against the real SDK (bindings/jvm/c/dprec_jni.c): releases made and signed by dprec-mkrelease,
 * a real `dprec-aggregator serve` over HTTPS for sync. The build passes the tools' paths as system properties
 * (bindings/jvm/CMakeLists.txt): dprec.mkrelease, dprec.aggregator, dprec.version, dprec.jni.library.
 */
public class DprecClientTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    private static File work;
    private static File pub;       /* the release key devices pin (DER) */
    private static File signedRel; /* 200 items, d = 8, signed */
    private static File compactRel;

    private static String prop(String name) {
        String v = System.getProperty(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException("system property " + name + " is not set (run the test through ctest)");
        }
        return v;
    }

    private static void run(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        copy(p.getInputStream(), out);
        if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed: " + out.toString("UTF-8"));
        }
    }

    private static void copy(InputStream in, OutputStream out) throws IOException {
        byte[] b = new byte[8192];
        int n;
        while ((n = in.read(b)) >= 0) {
            out.write(b, 0, n);
        }
    }

    @BeforeClass
    public static void releases() throws Exception {
        work = Files.createTempDirectory("dprec-jvm-test").toFile();
        String mk = prop("dprec.mkrelease");
        File key = new File(work, "key.pem");
        pub = new File(work, "pub.der");
        signedRel = new File(work, "r.rel");
        compactRel = new File(work, "r8.rel");
        run(mk, "--new-key", key.getPath(), pub.getPath());
        run(mk, "--random", "200", "8", "--seed", "3", "--sign", key.getPath(), "--out", signedRel.getPath());
        run(mk, "--random", "200", "8", "--seed", "3", "--encoding", "q8", "--sign", key.getPath(), "--out",
            compactRel.getPath());
    }

    @AfterClass
    public static void cleanup() {
        deleteTree(work);
    }

    private static void deleteTree(File f) {
        File[] kids = f.listFiles();
        if (kids != null) {
            for (File k : kids) {
                deleteTree(k);
            }
        }
        f.delete();
    }

    private static ByteBuffer map(File f) throws IOException {
        try (FileChannel ch = FileChannel.open(f.toPath(), StandardOpenOption.READ)) {
            return ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size());
        }
    }

    private static ByteBuffer direct(byte[] b) {
        ByteBuffer d = ByteBuffer.allocateDirect(b.length);
        d.put(b);
        d.flip();
        return d;
    }

    private static byte[] read(File f) throws IOException {
        return Files.readAllBytes(f.toPath());
    }

    private static DprecClient.Config config() {
        return new DprecClient.Config().numItems(200).dim(8).ratingCapacity(50).maxK(20);
    }

    private static int statusOf(Runnable r) {
        try {
            r.run();
        } catch (DprecException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(e.statusName()));
            return e.status();
        }
        fail("no DprecException");
        return 0;
    }

    @Test
    public void theVersionIsTheSdksVersion() {
        assertEquals(prop("dprec.version"), DprecClient.version());
    }

    @Test
    public void everyStatusConstantIsTheNativeCode() throws Exception {
        Set<Integer> values = new HashSet<Integer>();
        for (Field f : Status.class.getDeclaredFields()) {
            if (!Modifier.isStatic(f.getModifiers()) || f.getType() != int.class) {
                continue;
            }
            int v = f.getInt(null);
            String want = v == 0 ? "DPREC_OK" : "DPREC_ERR_" + f.getName();
            assertEquals(f.getName(), want, DprecException.nameOf(v));
            values.add(v);
        }
        for (int code = -1; code > -1000; code--) { /* and every code the library names has a constant */
            if (!DprecException.nameOf(code).equals("DPREC_UNKNOWN")) {
                assertTrue("no Status constant for " + DprecException.nameOf(code), values.contains(code));
            }
        }
    }

    @Test
    public void ratesVerifiesOnceAndRecommendsFromAMappedRelease() throws Exception {
        File dir = tmp.newFolder("store");
        ByteBuffer rel = map(signedRel);
        byte[] key = read(pub);
        try (DprecClient c = DprecClient.open(config(), dir)) {
            assertEquals(Status.OK, c.loadStatus());
            c.rate(10, 5.0f);
            c.rate(11, 1.0f, 1700000000L);
            c.rate(12, 4.5f);
            assertEquals(3, c.ratingCount());
            List<DprecClient.Rating> rs = c.ratings();
            assertEquals(11, rs.get(1).getItem());
            assertEquals(1.0f, rs.get(1).getValue(), 0.0f);
            assertEquals(1700000000L, rs.get(1).getTimestamp());
            assertEquals(Status.RELEASE_UNVERIFIED, statusOf(() -> c.recommend(rel, 5)));
            DprecClient.ReleaseInfo info = c.verify(rel, key);
            assertEquals(1, info.getFormatVersion());
            assertFalse(info.isCompact());
            assertEquals(200, info.getNumItems());
            assertEquals(8, info.getDim());
            assertEquals(rel.limit(), info.getTotalSize());
            assertTrue(info.getSignatureLength() > 0);
            List<DprecClient.Recommendation> top = c.recommend(rel, 5);
            assertEquals(5, top.size());
            Set<Integer> seen = new HashSet<Integer>();
            for (int i = 0; i < top.size(); i++) {
                DprecClient.Recommendation r = top.get(i);
                assertFalse("a rated item is never recommended", r.getItem() >= 10 && r.getItem() <= 12);
                assertTrue(seen.add(r.getItem()));
                assertTrue(r.getScore() >= 1.0f && r.getScore() <= 5.0f);
                if (i > 0) {
                    assertTrue(r.getScore() <= top.get(i - 1).getScore());
                }
                assertEquals(r.getScore(), c.predict(rel, r.getItem()), 0.0f);
            }
            assertEquals(8, c.userVector(8).length);
            assertTrue(c.memoryUsed() <= DprecClient.requiredSize(config()));
            c.remove(10);
            assertEquals(2, c.ratingCount());
            assertEquals(Status.NOT_RATED, statusOf(() -> c.remove(10)));
        }
        /* a restart: the ratings and the trusted release are in the store; no second verification needed */
        try (DprecClient c = DprecClient.open(config(), dir)) {
            assertEquals(2, c.ratingCount());
            assertEquals(5, c.recommend(rel, 5).size());
        }
    }

    @Test
    public void aForgedReleaseIsRefusedWithItsStatus() throws Exception {
        byte[] b = read(signedRel);
        int m = 200, d = 8;
        int sigLen = (b[46] & 0xff) | (b[47] & 0xff) << 8;
        /* item 7's bias set to 100, the digest recomputed (anyone can), the signature left */
        ByteBuffer w = ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
        w.putFloat(64 + 7 * 4 * (d + 1), 100.0f);
        int bodyEnd = 64 + m * 4 * (d + 1);
        byte[] digest = MessageDigest.getInstance("SHA-256").digest(java.util.Arrays.copyOf(b, bodyEnd));
        System.arraycopy(digest, 0, b, bodyEnd, 32);
        assertEquals(b.length, bodyEnd + 32 + sigLen);
        ByteBuffer forged = direct(b);
        byte[] key = read(pub);
        try (DprecClient c = DprecClient.open(config(), tmp.newFolder("forged"))) {
            assertEquals(Status.RELEASE_SIGNATURE, statusOf(() -> c.verify(forged, key)));
            assertEquals(Status.RELEASE_UNVERIFIED, statusOf(() -> c.recommend(forged, 3)));
            DprecException e = null;
            try {
                c.verify(forged, key);
            } catch (DprecException x) {
                e = x;
            }
            assertNotNull(e);
            assertEquals("DPREC_ERR_RELEASE_SIGNATURE", e.statusName());
            assertTrue(e.getMessage(), e.getMessage().contains("signature"));
        }
    }

    @Test
    public void aCompactReleaseVerifiesStreamedAndRecommends() throws Exception {
        ByteBuffer rel = map(compactRel);
        assertTrue(rel.limit() < read(signedRel).length / 2);
        try (DprecClient c = DprecClient.open(config(), tmp.newFolder("compact"))) {
            c.rate(3, 4.0f);
            DprecClient.ReleaseInfo info;
            try (InputStream in = new FileInputStream(compactRel)) {
                info = c.verify(in, read(pub)); /* streamed, as a download arrives */
            }
            assertTrue(info.isCompact());
            assertEquals(2, info.getFormatVersion());
            assertEquals(rel.limit(), info.getTotalSize());
            assertEquals(10, c.recommend(rel, 10).size());
        }
    }

    @Test
    public void badInputIsRefusedWithTheSdksStatus() throws Exception {
        File dir = tmp.newFolder("bad");
        try (DprecClient c = DprecClient.open(config(), dir)) {
            assertEquals(Status.ITEM_OUT_OF_RANGE, statusOf(() -> c.rate(200, 3.0f)));
            assertEquals(Status.ITEM_OUT_OF_RANGE, statusOf(() -> c.rate(-1, 3.0f)));
            assertEquals(Status.VALUE_NOT_FINITE, statusOf(() -> c.rate(1, Float.NaN)));
            assertEquals(Status.VALUE_OUT_OF_SCALE, statusOf(() -> c.rate(1, 7.0f)));
            assertEquals(0, c.ratingCount());
            /* one client per store: a second is refused while the first holds it */
            assertEquals(Status.STORE_LOCKED, statusOf(() -> DprecClient.open(config(), dir)));
            try {
                c.recommend(ByteBuffer.wrap(read(signedRel)), 3);
                fail("a heap buffer was accepted");
            } catch (IllegalArgumentException expected) {
                assertTrue(expected.getMessage().contains("direct"));
            }
        }
        DprecClient c = DprecClient.open(config(), dir); /* the lock went with close() */
        c.close();
        c.close(); /* a second close does nothing */
        try {
            c.rate(1, 3.0f);
            fail("a closed client was used");
        } catch (IllegalStateException expected) {
            assertTrue(expected.getMessage().contains("closed"));
        }
        assertEquals(Status.CONFIG, statusOf(() -> DprecClient.requiredSize(config().numItems(0))));
        assertEquals(Status.CONFIG, statusOf(() -> DprecClient.requiredSize(config().lambda(-1))));
    }

    @Test
    public void allOfTheSdksMemoryIsTheDirectBufferHandedOver() throws Exception {
        DprecClient.Config cfg = config();
        long need = DprecClient.requiredSize(cfg);
        ByteBuffer mem = ByteBuffer.allocateDirect((int) need);
        try (DprecClient c = DprecClient.open(cfg, tmp.newFolder("mem"), mem)) {
            c.rate(1, 2.0f);
            assertTrue(c.memoryUsed() > 0 && c.memoryUsed() <= need);
        }
        ByteBuffer small = ByteBuffer.allocateDirect((int) (need / 2));
        assertEquals(Status.NO_MEMORY, statusOf(() -> DprecClient.open(cfg, new File(tmp.getRoot(), "small"), small)));
        try {
            DprecClient.open(cfg, tmp.newFolder("heap"), ByteBuffer.allocate((int) need));
            fail("a heap buffer was accepted as the SDK's memory");
        } catch (IllegalArgumentException expected) {
            assertTrue(expected.getMessage().contains("direct"));
        }
    }

    @Test
    public void anEncryptedStoreNeedsItsKey() throws Exception {
        File dir = tmp.newFolder("enc");
        byte[] k = new byte[32];
        k[0] = 7;
        try (DprecClient c = DprecClient.open(config().storageKey(k), dir)) {
            c.rate(5, 3.0f);
        }
        assertEquals(Status.STORE_KEY, statusOf(() -> DprecClient.open(config().storageKey(new byte[32]), dir)));
        assertEquals(Status.STORE_KEY, statusOf(() -> DprecClient.open(config(), dir))); /* a plaintext reader */
        try (DprecClient c = DprecClient.open(config().storageKey(k), dir)) {
            assertEquals(1, c.ratingCount());
        }
    }

    /* ---- sync against a real aggregator ------------------------------------------------------------------------ */

    private static final class Aggregator implements AutoCloseable {
        final Process proc;
        final File state;
        final int devicePort, adminPort;
        final byte[] cert;
        final String adminToken;

        Aggregator(File state, String... extra) throws Exception {
            this.state = state;
            File log = new File(state.getParentFile(), "aggregator.log");
            java.util.List<String> cmd = new java.util.ArrayList<>(java.util.Arrays.asList(
                prop("dprec.aggregator"), "serve", "--state-dir", state.getPath(), "--listen", "127.0.0.1:0",
                "--admin-listen", "127.0.0.1:0", "--threads", "2"));
            cmd.addAll(java.util.Arrays.asList(extra));
            proc = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log).start();
            File ports = new File(state, "ports.json");
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            String json = null;
            while (System.nanoTime() < deadline) {
                if (!proc.isAlive()) {
                    throw new IllegalStateException("the aggregator exited: " + new String(read(log), StandardCharsets.UTF_8));
                }
                if (ports.exists()) {
                    json = new String(read(ports), StandardCharsets.UTF_8);
                    if (json.matches("(?s).*\"pid\"\\s*:\\s*" + proc.pid() + "\\D.*")) {
                        break;
                    }
                }
                json = null;
                Thread.sleep(50);
            }
            if (json == null) {
                throw new IllegalStateException("no ports.json after 30 s");
            }
            devicePort = intField(json, "device");
            adminPort = intField(json, "admin");
            cert = read(new File(state, "tls-cert.pem"));
            adminToken = new String(read(new File(state, "admin-token")), StandardCharsets.UTF_8).trim();
        }

        static int intField(String json, String name) {
            Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*(\\d+)").matcher(json);
            assertTrue(name + " in " + json, m.find());
            return Integer.parseInt(m.group(1));
        }

        String deviceUrl() {
            return "https://127.0.0.1:" + devicePort;
        }

        /* an admin call through the same pinned TLS as the devices' */
        String admin(String method, String path, String body) throws Exception {
            HttpsTransport t = HttpsTransport.trusting("https://127.0.0.1:" + adminPort, cert);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            Transport.Response r = t.request(method, path, adminToken, body != null ? "application/json" : null,
                                             body != null ? body.getBytes(StandardCharsets.UTF_8) : null, out);
            String s = out.toString("UTF-8");
            assertTrue(method + " " + path + ": " + r.status + " " + s, r.status / 100 == 2);
            return s;
        }

        @Override
        public void close() {
            proc.destroy();
            try {
                proc.waitFor(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    @Test
    public void syncsWithARealAggregatorOverPinnedHttps() throws Exception {
        File state = tmp.newFolder("agg", "state");
        try (Aggregator agg = new Aggregator(state)) {
            String job = agg.admin("POST", "/v1/admin/jobs",
                                   "{\"protocol\":\"plain\",\"d\":8,\"m\":200,\"rating_min\":1,\"rating_max\":5,"
                                   + "\"rounds\":3,\"min_reports\":1,\"round_seconds\":600,\"release_encoding\":\"q8\","
                                   + "\"params\":{\"lambda\":0.1,\"seed\":1}}");
            long jobId = Aggregator.intField(job, "job");
            byte[] releaseKey = read(new File(state, "release-key.der"));
            HttpsTransport t = HttpsTransport.trusting(agg.deviceUrl(), agg.cert);
            try (DprecClient c = DprecClient.open(config().allowNonPrivate(true), tmp.newFolder("device"))) {
                c.rate(1, 5.0f);
                c.rate(2, 3.0f);
                c.rate(150, 1.0f);
                DprecClient.SyncResult r = c.sync(t, jobId, releaseKey);
                assertEquals(DprecClient.SyncResult.Outcome.REPORTED, r.getOutcome());
                assertEquals(1, r.getRound());
                assertTrue(Aggregator.intField(agg.admin("GET", "/v1/admin/jobs/" + jobId, null), "rounds_done") >= 1);
                /* the next round's release, published by the aggregator, fetched (as another registered device) and
                 * verified on this one */
                ByteArrayOutputStream reg = new ByteArrayOutputStream();
                assertEquals(201, t.request("POST", "/v1/register", null, "application/json",
                                            "{}".getBytes(StandardCharsets.UTF_8), reg).status);
                Matcher tok = Pattern.compile("\"token\"\\s*:\\s*\"([0-9a-f]+)\"").matcher(reg.toString("UTF-8"));
                assertTrue(reg.toString("UTF-8"), tok.find());
                ByteArrayOutputStream rel = new ByteArrayOutputStream();
                Transport.Response resp = t.request("GET", "/v1/jobs/" + jobId + "/releases/latest", tok.group(1), null,
                                                    null, rel);
                assertEquals(200, resp.status);
                ByteBuffer release = direct(rel.toByteArray());
                DprecClient.ReleaseInfo info = c.verify(release, releaseKey);
                assertTrue("the job asked for q8 releases", info.isCompact());
                assertEquals(jobId, info.getJobId());
                assertEquals(10, c.recommend(release, 10).size());

                /* an aggregator whose certificate the transport does not trust: a TLS failure, with its status */
                assertEquals(Status.TLS, statusOf(() -> c.sync(HttpsTransport.to(agg.deviceUrl()), jobId, releaseKey)));
                /* nothing listening: no response, try again later */
                DprecClient.SyncResult later = c.sync(HttpsTransport.trusting("https://127.0.0.1:1", agg.cert),
                                                      jobId, releaseKey);
                assertEquals(DprecClient.SyncResult.Outcome.RETRY_LATER, later.getOutcome());
                assertEquals(Status.NETWORK, later.getLastError());
                assertTrue(later.getRetryAfterMillis() > 0);
                /* a transport with a bug: its exception reaches the caller as it was thrown */
                Transport broken = new Transport() {
                    @Override
                    public Response request(String method, String path, String bearer, String contentType,
                                            byte[] requestBody, OutputStream body) {
                        throw new UnsupportedOperationException("broken transport");
                    }
                };
                try {
                    c.sync(broken, jobId, releaseKey);
                    fail("the transport's exception was swallowed");
                } catch (UnsupportedOperationException expected) {
                    assertEquals("broken transport", expected.getMessage());
                }
                /* and the client still works */
                DprecClient.SyncResult again = c.sync(t, jobId, releaseKey);
                assertTrue(again.getOutcome() != DprecClient.SyncResult.Outcome.RETRY_LATER);

                /* the ledger says what this user spent, per job */
                DprecClient.LedgerEntry line = c.ledger(jobId);
                assertNotNull(line);
                assertEquals(jobId, line.getJobId());
                assertTrue(line.getReports() >= 1); /* round 1, and maybe round 2 just above */
                assertEquals(0, line.getModel()); /* plain: no privacy, and the ledger says so */
                assertEquals(1, c.ledger().size());
                assertEquals(null, c.ledger(jobId + 1000));
                assertEquals(2, c.spent(DprecClient.UNIT_USER).length);
                /* the trusted release: the one verified above, with its signature checked */
                DprecClient.ReleaseInfo trusted = c.trustedRelease();
                assertNotNull(trusted);
                assertArrayEquals(info.getDigest(), trusted.getDigest());
                assertFalse(trusted.isTrustedWithoutSignature());

                /* an unknown job: the aggregator's 404 and its code and message reach the app, and the outcome says
                 * not to retry it (issue 38) */
                DprecException unknown = null;
                try {
                    c.sync(t, 999999, releaseKey);
                } catch (DprecException e) {
                    unknown = e;
                }
                assertNotNull(unknown);
                assertEquals(Status.PROTOCOL, unknown.status());
                assertEquals(404, unknown.httpStatus());
                assertEquals("not_found", unknown.serverCode());
                assertTrue(unknown.getMessage(), unknown.getMessage().contains("HTTP 404 not_found: unknown job"));
                assertEquals(DprecClient.SyncResult.Outcome.FAILED, unknown.syncResult().getOutcome());
                assertEquals(0, unknown.syncResult().getRetryAfterMillis());

                /* the key pinned as the C transports pin it, tls-pin.txt as it is (its newline too) */
                String pin = new String(read(new File(state, "tls-pin.txt")), StandardCharsets.UTF_8);
                HttpsTransport pinned = HttpsTransport.pinned(agg.deviceUrl(), agg.cert, pin);
                assertTrue(c.sync(pinned, jobId, releaseKey).getOutcome() != DprecClient.SyncResult.Outcome.RETRY_LATER);
                HttpsTransport wrong = HttpsTransport.pinned(agg.deviceUrl(), agg.cert,
                                                             "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
                DprecException tls = null;
                try {
                    c.sync(wrong, jobId, releaseKey);
                } catch (DprecException e) {
                    tls = e;
                }
                assertNotNull(tls);
                assertEquals(Status.TLS, tls.status());
                assertTrue(tls.detail(), tls.detail().contains("matches no pinned key"));
                assertEquals(DprecClient.SyncResult.Outcome.FAILED, tls.syncResult().getOutcome());
                try {
                    HttpsTransport.pinned(agg.deviceUrl(), agg.cert, "sha256//short=");
                    fail("a malformed pin was accepted");
                } catch (IllegalArgumentException expected) {
                    assertTrue(expected.getMessage().contains("sha256//"));
                }
            }
        }
    }

    /* Enrollment (docs/protocol.md): an aggregator with registration "token" takes a device only with a token the
     * app's backend (here dprec-enroll) signed for the device's identity key. */
    @Test
    public void registersWithAnEnrollmentTokenForItsIdentityKey() throws Exception {
        File keys = tmp.newFolder("enroll");
        File key = new File(keys, "enroll.key"), pub = new File(keys, "enroll.pub"), tokFile = new File(keys, "token");
        run(prop("dprec.mkrelease"), "--new-key", key.getPath(), pub.getPath());
        File state = tmp.newFolder("agg-enroll", "state");
        try (Aggregator agg = new Aggregator(state, "--registration", "token", "--enrollment-key", pub.getPath(),
                                             "--app-id", "org.dprec.test")) {
            String job = agg.admin("POST", "/v1/admin/jobs",
                                   "{\"protocol\":\"plain\",\"d\":8,\"m\":200,\"rating_min\":1,\"rating_max\":5,"
                                   + "\"rounds\":3,\"min_reports\":1,\"round_seconds\":600,\"params\":{}}");
            long jobId = Aggregator.intField(job, "job");
            byte[] releaseKey = read(new File(state, "release-key.der"));
            HttpsTransport t = HttpsTransport.trusting(agg.deviceUrl(), agg.cert);
            File dir = tmp.newFolder("enrolled-device");
            byte[] identity;
            try (DprecClient c = DprecClient.open(config().allowNonPrivate(true), dir)) {
                identity = c.identityKey();
                assertEquals(65, identity.length);
                assertEquals(4, identity[0]);
                c.rate(1, 5.0f);
                assertEquals(Status.ENROLLMENT, statusOf(() -> c.sync(t, jobId, releaseKey)));
            }
            StringBuilder hex = new StringBuilder();
            for (byte b : identity) {
                hex.append(String.format("%02x", b & 0xff));
            }
            run(prop("dprec.enroll"), "--key", key.getPath(), "--app-id", "org.dprec.test", "--identity",
                hex.toString(), "--out", tokFile.getPath());
            byte[] token = read(tokFile);
            try (DprecClient c = DprecClient.open(config().allowNonPrivate(true), dir)) {
                assertArrayEquals("the identity is durable", identity, c.identityKey());
                DprecClient.SyncResult r = c.sync(t, jobId, releaseKey, token);
                assertEquals(DprecClient.SyncResult.Outcome.REPORTED, r.getOutcome());
            }
        }
    }

    @Test
    public void theReleaseKeyIsRequiredExceptForUnsignedTestData() throws Exception {
        try (DprecClient c = DprecClient.open(config(), tmp.newFolder("nokey"))) {
            try {
                c.verify(map(signedRel), new byte[0]);
                fail("an empty key was accepted");
            } catch (IllegalArgumentException expected) {
                assertTrue(expected.getMessage().contains("key"));
            }
            ByteBuffer unsigned = direct(unsignedCopy());
            byte[] key = read(pub);
            assertEquals(Status.RELEASE_SIGNATURE, statusOf(() -> c.verify(unsigned, key)));
            DprecClient.ReleaseInfo info = c.verifyInsecureUnsigned(unsigned);
            assertEquals(0, info.getSignatureLength());
            assertTrue(info.isTrustedWithoutSignature());
            assertTrue(c.trustedRelease().isTrustedWithoutSignature());
            assertEquals(32, info.getDigest().length);
            assertEquals(3, c.recommend(unsigned, 3).size());
        }
    }

    /* A download that breaks off: the stream throws, verify ends the SDK's stream, and the user's ratings can still be
     * saved (before: every later rate, remove and sync failed with STATE until another verify completed). */
    @Test
    public void aVerifyStreamThatThrowsIsEndedAndTheClientGoesOn() throws Exception {
        byte[] rel = read(signedRel);
        try (DprecClient c = DprecClient.open(config(), tmp.newFolder("broken-download"))) {
            InputStream broken = new InputStream() {
                private int at;

                @Override
                public int read() throws IOException {
                    if (at >= rel.length / 2) {
                        throw new IOException("connection reset");
                    }
                    return rel[at++] & 0xff;
                }
            };
            try {
                c.verify(broken, read(pub));
                fail("a broken download verified");
            } catch (IOException expected) {
                assertEquals("connection reset", expected.getMessage());
            }
            c.rate(4, 4.0f);
            c.remove(4);
            assertEquals(null, c.trustedRelease());
            /* a stream the SDK refuses (garbage) ends too, with its status */
            assertEquals(Status.RELEASE_MAGIC,
                         statusOf(() -> {
                             try {
                                 c.verify(new java.io.ByteArrayInputStream(new byte[4096]), read(pub));
                             } catch (IOException e) {
                                 throw new IllegalStateException(e);
                             }
                         }));
            c.rate(5, 4.0f);
            /* and a whole download verifies */
            try (InputStream in = new FileInputStream(signedRel)) {
                assertEquals(rel.length, c.verify(in, read(pub)).getTotalSize());
            }
            assertNotNull(c.trustedRelease());
        }
    }

    @Test
    public void failuresCarryTheSdksDetail() throws Exception {
        ByteBuffer rel = map(signedRel);
        try (DprecClient c = DprecClient.open(config(), tmp.newFolder("detail"))) {
            c.verify(rel, read(pub));
            DprecException e = null;
            try {
                c.predict(rel, 3);
            } catch (DprecException x) {
                e = x;
            }
            assertNotNull(e);
            assertEquals(Status.STATE, e.status());
            assertTrue(e.detail(), e.detail().contains("no user vector yet"));
            assertTrue(e.getMessage(), e.getMessage().contains("no user vector yet"));
            assertEquals(null, e.syncResult());
            /* a release of another d: both d's in the detail */
            DprecException mismatch = null;
            try (DprecClient other = DprecClient.open(config().dim(9), tmp.newFolder("detail9"))) {
                other.verify(rel, read(pub));
            } catch (DprecException x) {
                mismatch = x;
            }
            assertNotNull(mismatch);
            assertEquals(Status.RELEASE_MISMATCH, mismatch.status());
            assertTrue(mismatch.detail(), mismatch.detail().contains("d = 8") && mismatch.detail().contains("d = 9"));
        }
    }

    @Test
    public void theConfigTakesSecureAggregationAndSgldAndSaysWhatIsWrong() throws Exception {
        long base = DprecClient.requiredSize(config());
        assertTrue("secure aggregation takes its memory", DprecClient.requiredSize(config().secaggMaxLen(2000)) > base);
        assertTrue(DprecClient.requiredSize(config().sgld(100, 1.0)) >= base);
        try (DprecClient c = DprecClient.open(config().secaggMaxLen(2000).secaggMinColluders(2).sgld(100, 1.0),
                                              tmp.newFolder("secagg"))) {
            c.rate(1, 3.0f);
        }
        assertEquals(Status.CONFIG, statusOf(() -> DprecClient.requiredSize(config().sgld(70000, 0))));
        try {
            config().storageKey(new byte[16]);
            fail("a 16-byte storage key was accepted");
        } catch (IllegalArgumentException expected) {
            assertTrue(expected.getMessage(), expected.getMessage().contains("32 bytes"));
        }
        try {
            config().dim(-1);
            fail("a negative d was accepted");
        } catch (IllegalArgumentException expected) {
            assertTrue(expected.getMessage(), expected.getMessage().contains("dim"));
        }
    }

    /* Two live clients over one buffer would write each other's state: the second is refused, a slice of it too. */
    @Test
    public void aBufferALiveClientUsesIsRefused() throws Exception {
        DprecClient.Config cfg = config();
        ByteBuffer mem = ByteBuffer.allocateDirect((int) DprecClient.requiredSize(cfg) + 64);
        try (DprecClient c = DprecClient.open(cfg, tmp.newFolder("one"), mem)) {
            c.rate(1, 5.0f);
            for (ByteBuffer again : new ByteBuffer[] {mem, mem.duplicate()}) {
                try {
                    DprecClient.open(cfg, tmp.newFolder(), again);
                    fail("a buffer in use was accepted");
                } catch (IllegalArgumentException expected) {
                    assertTrue(expected.getMessage(), expected.getMessage().contains("still open"));
                }
            }
            assertEquals(1, c.ratingCount());
        }
        try (DprecClient c = DprecClient.open(cfg, tmp.newFolder("two"), mem)) { /* free once the first closed */
            assertEquals(0, c.ratingCount());
        }
    }

    /* the signed release with its signature removed (sig_alg and sig_len zero, digest recomputed) */
    private static byte[] unsignedCopy() throws Exception {
        byte[] b = read(signedRel);
        int sigLen = (b[46] & 0xff) | (b[47] & 0xff) << 8;
        byte[] u = java.util.Arrays.copyOf(b, b.length - sigLen);
        u[44] = u[45] = u[46] = u[47] = 0;
        int bodyEnd = u.length - 32;
        System.arraycopy(MessageDigest.getInstance("SHA-256").digest(java.util.Arrays.copyOf(u, bodyEnd)), 0, u, bodyEnd, 32);
        return u;
    }
}
