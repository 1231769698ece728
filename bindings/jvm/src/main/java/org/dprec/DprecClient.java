package org.dprec;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The dprec device SDK from Java or Kotlin: a user's ratings kept on the device, recommendations computed there from
 * the aggregator's signed releases, and {@link #sync} with the aggregator (docs/sdk.md, "From a Java or Kotlin app").
 *
 * <p>All of the SDK's memory is one direct {@link ByteBuffer} of {@link #requiredSize(Config)} bytes, allocated here or
 * handed over by the app ({@link #open(Config, File, ByteBuffer)}); the SDK allocates nothing else and starts no
 * thread. Releases are direct buffers too: a {@link java.nio.MappedByteBuffer} of a release file is read in place.
 * Every failure is a {@link DprecException} with the SDK's status code. Methods are synchronized: a client serves one
 * call at a time. {@link #close()} wipes the ratings from memory and releases the store's lock; use try-with-resources
 * (Kotlin: {@code use}).
 *
 * <pre>
 * DprecClient.Config cfg = new DprecClient.Config().numItems(1682).dim(16);
 * try (DprecClient c = DprecClient.open(cfg, new File(context.getFilesDir(), "dprec"))) {
 *     c.rate(50, 5.0f);
 *     c.verify(release, aggregatorKeyDer);          // once, when the release arrives
 *     for (Recommendation r : c.recommend(release, 10)) show(r.getItem(), r.getScore());
 * }
 * </pre>
 */
public final class DprecClient implements AutoCloseable {

    /** The SDK's version, "major.minor.patch" (dprec_version). */
    public static String version() {
        return nativeVersion();
    }

    /** The client's configuration (dprec_config); the setters return this. Defaults as dprec_config_default. */
    public static final class Config {
        int numItems, dim = 16, ratingCapacity = 1000, maxK = 100;
        double ratingMin = 1, ratingMax = 5, lambda = 0.1;
        String storeName;
        byte[] storageKey;
        double capUserEpsilon, capUserDelta, capRatingEpsilon, capRatingDelta;
        boolean allowNonPrivate;
        int ledgerJobs = 8, pendingSlots = 1, maxReportBytes = 4096, fwMaxRatings;
        int sgldMaxRatings, secaggMaxLen, secaggMinColluders = 1;
        double sgldEpsilon;

        private static int notNegative(String what, int n) {
            if (n < 0) {
                throw new IllegalArgumentException(what + " must not be negative, not " + n);
            }
            return n;
        }

        /** m, the catalogue size: items are 0 .. m-1 (required). */
        public Config numItems(int m) { numItems = notNegative("numItems", m); return this; }
        /** d, the latent dimension of the releases (default 16). */
        public Config dim(int d) { dim = notNegative("dim", d); return this; }
        /** The most ratings the store holds (default 1000). */
        public Config ratingCapacity(int n) { ratingCapacity = notNegative("ratingCapacity", n); return this; }
        /** The largest k of {@link #recommend} (default 100). */
        public Config maxK(int k) { maxK = notNegative("maxK", k); return this; }
        /** The rating scale (default 1 .. 5); releases must have the same. */
        public Config ratingScale(double min, double max) { ratingMin = min; ratingMax = max; return this; }
        /** The ridge of the user vector's least squares (default 0.1). */
        public Config lambda(double l) { lambda = l; return this; }
        /** The prefix of the store's files (default "dprec-ratings"). */
        public Config storeName(String name) { storeName = name; return this; }
        /** Encrypts the store at rest (AES-256-GCM) under this 32-byte key, e.g. from the Android Keystore (null: a
         *  plaintext store). IllegalArgumentException for a key of another length. */
        public Config storageKey(byte[] key32) {
            if (key32 != null && key32.length != 32) {
                throw new IllegalArgumentException("storageKey needs 32 bytes (AES-256), not " + key32.length);
            }
            storageKey = key32 == null ? null : key32.clone();
            return this;
        }
        /** The user's privacy cap at user level over all jobs (default 0: no private report leaves the device). */
        public Config userBudget(double epsilon, double delta) { capUserEpsilon = epsilon; capUserDelta = delta; return this; }
        /** The cap at rating level (default 0). */
        public Config ratingBudget(double epsilon, double delta) { capRatingEpsilon = epsilon; capRatingDelta = delta; return this; }
        /** Lets non-private ("plain" protocol) reports leave the device (default false). */
        public Config allowNonPrivate(boolean allow) { allowNonPrivate = allow; return this; }
        /** Ledger lines, one per job ever reported to (default 8). */
        public Config ledgerJobs(int n) { ledgerJobs = notNegative("ledgerJobs", n); return this; }
        /** Reports stored until acknowledged (default 1). */
        public Config pendingSlots(int n) { pendingSlots = notNegative("pendingSlots", n); return this; }
        /** The largest report in bytes (default 4096). */
        public Config maxReportBytes(int n) { maxReportBytes = notNegative("maxReportBytes", n); return this; }
        /** private-fw: the most ratings a job may ask the device to sample (default 0: none). */
        public Config fwMaxRatings(int n) { fwMaxRatings = notNegative("fwMaxRatings", n); return this; }
        /** sgld (a trusted curator receives the ratings themselves): the most ratings the device uploads to one
         *  (default 0: sgld jobs are refused; at most 65535), and its own epsilon for them (0: the job's). */
        public Config sgld(int maxRatings, double epsilon) {
            sgldMaxRatings = notNegative("sgld maxRatings", maxRatings);
            sgldEpsilon = epsilon;
            return this;
        }
        /** Secure aggregation: the longest vector a job may ask the device to mask (default 0: such jobs are
         *  refused; gauss-gd needs m (d + 1), dpals m (d (d + 1) / 2 + d)); the client's memory grows with it. */
        public Config secaggMaxLen(int n) { secaggMaxLen = notNegative("secaggMaxLen", n); return this; }
        /** Secure aggregation against an active server: the fewest colluding devices a round must tolerate (default
         *  1; docs/sdk.md). */
        public Config secaggMinColluders(int n) { secaggMinColluders = notNegative("secaggMinColluders", n); return this; }

        /* the order is a contract with bindings/jvm/c/dprec_jni.c (CI_* and CD_*) */
        int[] ints() {
            return new int[] {numItems, dim, ratingCapacity, maxK, storageKey != null ? 1 : 0, allowNonPrivate ? 1 : 0,
                              ledgerJobs, pendingSlots, maxReportBytes, fwMaxRatings, sgldMaxRatings, secaggMaxLen,
                              secaggMinColluders};
        }

        double[] doubles() {
            return new double[] {ratingMin, ratingMax, lambda, capUserEpsilon, capUserDelta, capRatingEpsilon,
                                 capRatingDelta, sgldEpsilon};
        }
    }

    /** One rating of the store. */
    public static final class Rating {
        private final int item;
        private final float value;
        private final long timestamp;

        Rating(int item, float value, long timestamp) {
            this.item = item;
            this.value = value;
            this.timestamp = timestamp;
        }

        public int getItem() { return item; }
        public float getValue() { return value; }
        /** Seconds since the Unix epoch. */
        public long getTimestamp() { return timestamp; }
    }

    /** One recommended item and its predicted rating (clamped to the scale). */
    public static final class Recommendation {
        private final int item;
        private final float score;

        Recommendation(int item, float score) {
            this.item = item;
            this.score = score;
        }

        public int getItem() { return item; }
        public float getScore() { return score; }

        @Override
        public String toString() {
            return "item " + item + " (" + score + ")";
        }
    }

    /** What {@link #verify} checked: the release's header fields and digest (dprec_release_info). */
    public static final class ReleaseInfo {
        private final long[] v;
        private final byte[] digest;
        private final boolean unchecked;

        ReleaseInfo(long[] v, byte[] digest, boolean unchecked) {
            this.v = v;
            this.digest = digest;
            this.unchecked = unchecked;
        }

        /** 1, or 2 for a compact release (16- or 8-bit factors, docs/release-format.md). */
        public int getFormatVersion() { return (int) v[0]; }
        public int getFlags() { return (int) v[1]; }
        public boolean isCompact() { return v[0] == 2; }
        public long getReleaseVersion() { return v[2]; }
        public long getJobId() { return v[3]; }
        public int getNumItems() { return (int) v[4]; }
        public int getDim() { return (int) v[5]; }
        public int getSignatureLength() { return (int) v[6]; }
        public long getTotalSize() { return v[7]; }
        /** The SHA-256 digest of header and body (a copy). */
        public byte[] getDigest() { return digest.clone(); }
        /** Whether it is trusted without a signature check ({@link DprecClient#verifyInsecureUnsigned}: test data only). */
        public boolean isTrustedWithoutSignature() { return unchecked; }
    }

    /** A job's line in the privacy ledger (dprec_ledger_entry): what this user has spent on it. */
    public static final class LedgerEntry {
        private final long[] n;
        private final double[] d;

        LedgerEntry(long[] n, double[] d) {
            this.n = n;
            this.d = d;
        }

        public long getJobId() { return n[0]; }
        /** The unit the job's epsilon protects: {@link #UNIT_RATING} or {@link #UNIT_USER}. */
        public int getUnit() { return (int) n[1]; }
        /** The privacy model (dprec_model: 0 none, 1 local, 2 central, 3 joint, 4 posterior heuristic, 5 distributed,
         *  6 secure aggregation). */
        public int getModel() { return (int) n[2]; }
        public long getReports() { return n[3]; }
        /** Rounds charged: the reports, and the rounds sat out of a Poisson-sampled job. */
        public long getRounds() { return n[4]; }
        public long getLastRound() { return n[5]; }
        /** The most rounds the job may charge (0: no limit). */
        public long getMaxRounds() { return n[6]; }
        /** The job's cumulative epsilon and delta at its unit. */
        public double getEpsilon() { return d[0]; }
        public double getDelta() { return d[1]; }
        /** The same at user level (what the user budget bounds). */
        public double getUserEpsilon() { return d[2]; }
        public double getUserDelta() { return d[3]; }
    }

    /** Ledger units (dprec_unit): neighbouring data sets differ in one rating, or in all the ratings of one user. */
    public static final int UNIT_RATING = 1, UNIT_USER = 2;

    /** What one {@link #sync} step did (dprec_sync_result). */
    public static final class SyncResult {
        /** REPORTED: a report was acknowledged; NOTHING_TO_DO: already reported, sat out, or the job is done;
         *  RETRY_LATER: a transient failure, call again after {@link #getRetryAfterMillis()}; IN_PROGRESS: a step of
         *  the round's secure aggregation was done and the round needs more of the device, call again after
         *  {@link #getRetryAfterMillis()} (jobs with params.aggregation "secure"). In the SDK's order. */
        public enum Outcome { REPORTED, NOTHING_TO_DO, RETRY_LATER, IN_PROGRESS,
            /** The sync failed for a reason calling again cannot fix (a TLS or pin failure, a refused job, the
             *  device's policy or budget, a release that does not verify): do not retry on a timer. Carried by the
             *  {@link DprecException} such a sync throws ({@link DprecException#syncResult()}). */
            FAILED }

        private final long[] v;

        SyncResult(long[] v) {
            this.v = v;
        }

        public Outcome getOutcome() { return Outcome.values()[(int) v[0]]; }
        /** When to call again (the round's deadline, Retry-After, or backoff with jitter). */
        public long getRetryAfterMillis() { return v[1]; }
        public long getRound() { return v[2]; }
        public long getReleaseVersion() { return v[3]; }
        public boolean isJobDone() { return v[4] != 0; }
        /** The status behind a RETRY_LATER or a FAILED, or 0. */
        public int getLastError() { return (int) v[5]; }
    }

    /** Verify without a signature check: for unsigned test data only (DPREC_VERIFY_INSECURE_UNSIGNED). */
    public static final int VERIFY_INSECURE_UNSIGNED = 1;

    /* The memory of every live client, as [address, address + capacity) ranges: two clients over one buffer (or over
     * overlapping slices of one) would write each other's state, and one user's rating would land in another's store. */
    private static final List<long[]> LIVE = new ArrayList<long[]>();

    private final ByteBuffer memory; /* the SDK's: kept alive as long as this client */
    private long[] range;            /* its entry in LIVE while open */
    private final ByteBuffer topk;   /* the top-K's output, 8 bytes an item */
    private final ByteBuffer chunk;  /* a streamed verification's chunks */
    private final int loadStatus;
    private long handle;

    private DprecClient(ByteBuffer memory, int maxK, long handle, int loadStatus) {
        this.memory = memory;
        this.topk = ByteBuffer.allocateDirect(8 * maxK).order(ByteOrder.nativeOrder());
        this.chunk = ByteBuffer.allocateDirect(64 * 1024);
        this.handle = handle;
        this.loadStatus = loadStatus;
    }

    /** The bytes of memory a client with this configuration takes (its buffer). DprecException for an invalid one. */
    public static long requiredSize(Config cfg) {
        long n = nativeRequiredSize(cfg.ints(), cfg.doubles(), cfg.storeName);
        if (n < 0) {
            throw new DprecException((int) n, "configuration");
        }
        return n;
    }

    /** Opens the client over the store in {@code dir} (created if missing), in memory allocated here. */
    public static DprecClient open(Config cfg, File dir) {
        long n = requiredSize(cfg);
        if (n > Integer.MAX_VALUE) {
            throw new DprecException(Status.NO_MEMORY, "a configuration of " + n + " bytes");
        }
        return open(cfg, dir, ByteBuffer.allocateDirect((int) n));
    }

    /**
     * Opens the client over the store in {@code dir}, in {@code memory}: a direct buffer of at least
     * {@link #requiredSize(Config)} bytes that the app keeps for no other use. Loads the store and takes its lock:
     * {@link Status#STORE_LOCKED} while another client (this process or another) has it. A damaged newest
     * generation is not fatal: the client holds the newest good one, and {@link #loadStatus()} says what happened.
     */
    public static DprecClient open(Config cfg, File dir, ByteBuffer memory) {
        if (memory == null || !memory.isDirect()) {
            throw new IllegalArgumentException("the SDK's memory must be a direct ByteBuffer (ByteBuffer.allocateDirect)");
        }
        long[] range = {nativeAddress(memory), 0};
        range[1] = range[0] + memory.capacity();
        synchronized (LIVE) {
            for (long[] r : LIVE) {
                if (range[0] < r[1] && r[0] < range[1]) {
                    throw new IllegalArgumentException("this buffer is (or overlaps) the memory of a client that is "
                                                       + "still open: give each client its own, or close the other");
                }
            }
            LIVE.add(range);
        }
        boolean opened = false;
        try {
            int[] load = new int[1];
            long h = nativeOpen(memory, cfg.ints(), cfg.doubles(), cfg.storeName, dir.getPath(), cfg.storageKey, load);
            if (h < 0) {
                throw new DprecException((int) h, "open " + dir);
            }
            DprecClient c = new DprecClient(memory, cfg.maxK, h, load[0]);
            c.range = range;
            opened = true;
            return c;
        } finally {
            if (!opened) {
                synchronized (LIVE) {
                    LIVE.remove(range);
                }
            }
        }
    }

    /** {@link Status#OK}, or {@link Status#STORE_CORRUPT} / {@link Status#STORE_TRUNCATED} if the newest store
     *  generation was refused at open and the previous one was loaded. */
    public int loadStatus() {
        return loadStatus;
    }

    private long h() {
        if (handle == 0) {
            throw new IllegalStateException("the client is closed");
        }
        return handle;
    }

    /* The failure as a DprecException with the SDK's detail of it (dprec_client_last_error_info). */
    private DprecException failure(int rc, String what, SyncResult sync) {
        int[] nums = new int[2];
        String[] text = handle != 0 ? nativeLastError(handle, nums) : null;
        if (text == null) {
            return new DprecException(rc, what, "", 0, "", sync);
        }
        return new DprecException(rc, what, text[0], nums[1], text[2], sync);
    }

    private int check(int rc, String what) {
        if (rc < 0) {
            throw failure(rc, what, null);
        }
        return rc;
    }

    /** Rates {@code item} now. Durable when this returns. */
    public synchronized void rate(int item, float value) {
        check(nativeRate(h(), item, value, Long.MIN_VALUE), "rate " + item);
    }

    /** Rates {@code item} at a time, in seconds since the Unix epoch. Durable when this returns. */
    public synchronized void rate(int item, float value, long timestampSeconds) {
        if (timestampSeconds == Long.MIN_VALUE) {
            throw new IllegalArgumentException("timestamp");
        }
        check(nativeRate(h(), item, value, timestampSeconds), "rate " + item);
    }

    /** Removes the rating of {@code item} ({@link Status#NOT_RATED} if there is none). */
    public synchronized void remove(int item) {
        check(nativeRemove(h(), item), "remove " + item);
    }

    /** The number of ratings held. */
    public synchronized int ratingCount() {
        return nativeCount(h());
    }

    /** The ratings, by increasing item. */
    public synchronized List<Rating> ratings() {
        int n = nativeCount(h());
        List<Rating> out = new ArrayList<Rating>(n);
        int[] item = new int[1];
        float[] value = new float[1];
        long[] ts = new long[1];
        for (int i = 0; i < n; i++) {
            check(nativeRatingAt(h(), i, item, value, ts), "rating " + i);
            out.add(new Rating(item[0], value[0], ts[0]));
        }
        return Collections.unmodifiableList(out);
    }

    private static long releaseLength(ByteBuffer release) {
        if (release == null || !release.isDirect()) {
            throw new IllegalArgumentException("a release must be a direct ByteBuffer (ByteBuffer.allocateDirect, FileChannel.map)");
        }
        if (release.position() != 0) {
            throw new IllegalArgumentException("a release starts at position 0 of its buffer (its limit is its length)");
        }
        return release.limit();
    }

    /**
     * Verifies a release (its header, size, values, SHA-256 digest and the aggregator's ECDSA P-256 signature under
     * {@code releaseKey}, the DER public key the app pinned) and makes it the trusted release, saved in the store, so
     * that {@link #recommend} and {@link #predict} use it without checking it again. Do this once when a release
     * arrives; keep its bytes where only the app can change them.
     */
    public synchronized ReleaseInfo verify(ByteBuffer release, byte[] releaseKey) {
        if (releaseKey == null || releaseKey.length == 0) {
            throw new IllegalArgumentException("the aggregator's release key is required (verifyInsecureUnsigned: test data only)");
        }
        return verify(release, releaseKey, 0);
    }

    /** Trusts an unsigned release on its digest alone: for test data and offline demos only. */
    public synchronized ReleaseInfo verifyInsecureUnsigned(ByteBuffer release) {
        return verify(release, null, VERIFY_INSECURE_UNSIGNED);
    }

    private ReleaseInfo verify(ByteBuffer release, byte[] key, int flags) {
        long[] v = new long[8];
        byte[] digest = new byte[32];
        check(nativeVerify(h(), release, releaseLength(release), key, flags, v, digest), "verify");
        return new ReleaseInfo(v, digest, key == null || v[6] == 0);
    }

    /**
     * Verifies a release as it streams from {@code in} (a download), in chunks, without holding it: the trusted
     * release changes only if all of it arrived and verified. The app must still keep the bytes it recommends from
     * (this checks them; it does not keep them).
     */
    public synchronized ReleaseInfo verify(InputStream in, byte[] releaseKey) throws IOException {
        if (in == null || releaseKey == null || releaseKey.length == 0) {
            throw new IllegalArgumentException("a stream and the aggregator's release key are required");
        }
        long h = h();
        check(nativeVerifyBegin(h), "verify");
        boolean open = true; /* the SDK's verify stream: ended on every way out, or every later write would fail */
        try {
            byte[] buf = new byte[chunk.capacity()];
            int n;
            while ((n = in.read(buf)) >= 0) {
                chunk.clear();
                chunk.put(buf, 0, n);
                int rc = nativeVerifyFeed(h, chunk, n);
                if (rc < 0) {
                    open = false; /* a feed that fails ends the stream (the SDK's rule) */
                    throw failure(rc, "verify", null);
                }
            }
            long[] v = new long[8];
            byte[] digest = new byte[32];
            open = false;
            check(nativeVerifyEnd(h, releaseKey, 0, v, digest), "verify");
            return new ReleaseInfo(v, digest, false);
        } finally {
            if (open) { /* the stream threw (an interrupted download), or anything else did: the release is refused */
                nativeVerifyEnd(h, null, 0, null, null);
            }
        }
    }

    /** The client's trusted release (the one {@link #recommend} and {@link #predict} accept), as it was verified;
     *  null if there is none. */
    public synchronized ReleaseInfo trustedRelease() {
        long[] v = new long[8];
        byte[] digest = new byte[32];
        int[] insecure = new int[1];
        int rc = nativeTrusted(h(), v, digest, insecure);
        if (rc == Status.NOT_FOUND) {
            return null;
        }
        check(rc, "trusted release");
        return new ReleaseInfo(v, digest, insecure[0] != 0);
    }

    /** What this user has spent on job {@code jobId} (its privacy ledger line), or null if the job never charged. */
    public synchronized LedgerEntry ledger(long jobId) {
        long[] n = new long[7];
        double[] d = new double[4];
        int rc = nativeLedgerLine(h(), -1, jobId, n, d);
        if (rc == Status.NOT_FOUND) {
            return null;
        }
        check(rc, "ledger job " + jobId);
        return new LedgerEntry(n, d);
    }

    /** Every job of the privacy ledger, in the ledger's order. */
    public synchronized List<LedgerEntry> ledger() {
        int count = nativeLedgerCount(h());
        List<LedgerEntry> out = new ArrayList<LedgerEntry>(count);
        for (int i = 0; i < count; i++) {
            long[] n = new long[7];
            double[] d = new double[4];
            check(nativeLedgerLine(h(), i, 0, n, d), "ledger line " + i);
            out.add(new LedgerEntry(n, d));
        }
        return Collections.unmodifiableList(out);
    }

    /** The total {epsilon, delta} spent at {@code unit} ({@link #UNIT_USER}: every job's user-level figures, what
     *  {@link Config#userBudget} bounds; {@link #UNIT_RATING}: the rating-level jobs'), over all jobs. */
    public synchronized double[] spent(int unit) {
        double[] out = new double[2];
        check(nativeLedgerTotal(h(), unit, out), "ledger total");
        return out;
    }

    /** The {@code k} best items the user has not rated, best first, from the trusted release in {@code release}. */
    public synchronized List<Recommendation> recommend(ByteBuffer release, int k) {
        if (k <= 0 || 8L * k > topk.capacity()) {
            throw new IllegalArgumentException("k must be in 1 .. maxK, not " + k);
        }
        int n = check(nativeRecommend(h(), release, releaseLength(release), k, topk), "recommend");
        List<Recommendation> out = new ArrayList<Recommendation>(n);
        for (int i = 0; i < n; i++) {
            out.add(new Recommendation(topk.getInt(8 * i), topk.getFloat(8 * i + 4)));
        }
        return Collections.unmodifiableList(out);
    }

    /** The user vector from the trusted release (dprec_fit): what {@link #predict} uses. */
    public synchronized void fit(ByteBuffer release) {
        check(nativeFit(h(), release, releaseLength(release)), "fit");
    }

    /** The predicted rating of {@code item}, after {@link #fit} or {@link #recommend} on the same release. */
    public synchronized float predict(ByteBuffer release, int item) {
        float[] s = new float[1];
        check(nativePredict(h(), release, releaseLength(release), item, s), "predict " + item);
        return s[0];
    }

    /** The fitted user vector (d floats). */
    public synchronized float[] userVector(int dim) {
        float[] u = new float[dim];
        check(nativeUserVector(h(), u), "userVector");
        return u;
    }

    /**
     * One step of the sync loop with the aggregator for job {@code jobId} (dprec_client_sync): registers, re-sends
     * stored reports, fetches the job and its release (verified under {@code releaseKey}), checks the job against
     * the device's own privacy policy, builds, charges, stores and sends the report. Call it again after
     * {@link SyncResult#getRetryAfterMillis()}. Runs the transport on this thread; an exception the transport throws
     * other than an IOException ends the sync and is rethrown here.
     */
    public synchronized SyncResult sync(Transport transport, long jobId, byte[] releaseKey) {
        return sync(transport, jobId, releaseKey, null);
    }

    /**
     * As {@link #sync(Transport, long, byte[])}, with the enrollment token the app's backend signed for this device's
     * {@link #identityKey()} (docs/protocol.md, "Enrollment"): an aggregator that registers only enrolled devices
     * refuses a device without a valid one with {@link Status#ENROLLMENT}. May be null; it is only sent while the
     * device registers.
     */
    public synchronized SyncResult sync(Transport transport, long jobId, byte[] releaseKey, byte[] enrollmentToken) {
        if (transport == null || releaseKey == null || releaseKey.length == 0) {
            throw new IllegalArgumentException("a transport and the aggregator's release key are required");
        }
        long[] v = new long[6];
        v[0] = SyncResult.Outcome.FAILED.ordinal(); /* what a refusal before the SDK's call means */
        int rc = nativeSync(h(), transport, jobId, releaseKey, enrollmentToken, v);
        if (rc < 0) {
            if (v[5] == 0) {
                v[5] = rc;
            }
            throw failure(rc, "sync job " + jobId, new SyncResult(v));
        }
        return new SyncResult(v);
    }

    /**
     * The device's identity public key (65 bytes: an uncompressed P-256 point), drawn and stored durably the first
     * time, the same ever after. The app sends it to its own backend to get an enrollment token signed for it.
     */
    public synchronized byte[] identityKey() {
        byte[] out = new byte[65];
        check(nativeIdentityKey(h(), out), "identity key");
        return out;
    }

    /** The bytes of the buffer the SDK uses (its peak: it never grows after open). */
    public synchronized long memoryUsed() {
        return nativeMemoryUsed(h());
    }

    /** Frees the client: ratings and keys wiped from memory, the store's lock released. A second call does nothing. */
    @Override
    public synchronized void close() {
        if (handle != 0) {
            nativeClose(handle);
            handle = 0;
            synchronized (LIVE) {
                LIVE.remove(range); /* the buffer may serve another client now */
            }
        }
    }

    /* The SDK's sink for one response body, given to the transport as an OutputStream. */
    static final class Sink extends OutputStream {
        private final long call;

        Sink(long call) {
            this.call = call;
        }

        @Override
        public void write(int b) throws IOException {
            write(new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            int rc = nativeWrite(call, b, off, len);
            if (rc != 0) {
                throw new IOException("the SDK refused the response: " + DprecException.nameOf(rc));
            }
        }

        private static native int nativeWrite(long call, byte[] b, int off, int len);
    }

    static {
        NativeLibrary.load();
    }

    private static native String nativeVersion();
    private static native long nativeRequiredSize(int[] ints, double[] doubles, String storeName);
    private static native long nativeOpen(ByteBuffer memory, int[] ints, double[] doubles, String storeName, String dir,
                                          byte[] storageKey, int[] load);
    private static native void nativeClose(long h);
    private static native long nativeMemoryUsed(long h);
    private static native int nativeRate(long h, int item, float value, long timestamp);
    private static native int nativeRemove(long h, int item);
    private static native int nativeCount(long h);
    private static native int nativeRatingAt(long h, int index, int[] item, float[] value, long[] timestamp);
    private static native int nativeVerify(long h, ByteBuffer release, long len, byte[] key, int flags, long[] info,
                                           byte[] digest);
    private static native int nativeVerifyBegin(long h);
    private static native int nativeVerifyFeed(long h, ByteBuffer chunk, int len);
    private static native int nativeVerifyEnd(long h, byte[] key, int flags, long[] info, byte[] digest);
    private static native int nativeRecommend(long h, ByteBuffer release, long len, int k, ByteBuffer out);
    private static native int nativeFit(long h, ByteBuffer release, long len);
    private static native int nativePredict(long h, ByteBuffer release, long len, int item, float[] score);
    private static native int nativeUserVector(long h, float[] out);
    private static native int nativeSync(long h, Transport transport, long jobId, byte[] key, byte[] token,
                                         long[] out);
    private static native int nativeIdentityKey(long h, byte[] out);
    private static native long nativeAddress(ByteBuffer buffer);
    private static native String[] nativeLastError(long h, int[] nums);
    private static native int nativeTrusted(long h, long[] info, byte[] digest, int[] insecure);
    private static native int nativeLedgerCount(long h);
    private static native int nativeLedgerLine(long h, int index, long jobId, long[] n, double[] d);
    private static native int nativeLedgerTotal(long h, int unit, double[] out);
}
