#!/usr/bin/env python3
"""dprec-device end to end (issue 19): releases are verified before use, and one command uses a store at a time.

usage: device_cli.py DPREC_DEVICE DPREC_MKRELEASE

1. A release signed with a fresh key is accepted with --key, and afterwards without it (the store's trusted
   release); a forged copy (item 42's bias set to 100, digest recomputed, the old signature kept: valid digest,
   invalid signature) is refused by verify, recommend and predict, with or without --key, and item 42 is never
   printed; an unsigned release is refused unless --insecure-unsigned says otherwise, every later use of it warns,
   and --insecure-unsigned never takes a signed release (the forged one included) without --key.
2. While another process holds the store's lock (flock on DIR/dprec-ratings.lock, as a running dprec-device
   would), a command waits, then fails with a clear message and changes nothing.
Exits non-zero with a message on the first failed check."""
import fcntl
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import time

DEVICE, MKRELEASE = sys.argv[1], sys.argv[2]
M, D = 100, 8


def run(*args, expect=0):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if p.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def forge(src, dst):
    """Sets item 42's bias to 100 and recomputes the digest; the signature bytes stay (they no longer match)."""
    b = bytearray(open(src, "rb").read())
    sig_len = struct.unpack_from("<H", b, 46)[0]
    struct.pack_into("<f", b, 64 + 42 * 4 * (D + 1), 100.0)
    end = len(b) - sig_len - 32
    b[end:end + 32] = hashlib.sha256(bytes(b[:end])).digest()
    open(dst, "wb").write(bytes(b))


def items_listed(out):
    return [int(line.split()[1]) for line in out.splitlines() if line and not line.startswith("#")
            and len(line.split()) == 3]


with tempfile.TemporaryDirectory() as tmp:
    key, pub = os.path.join(tmp, "key.pem"), os.path.join(tmp, "pub.der")
    signed, forged, unsigned = (os.path.join(tmp, n) for n in ("signed.rel", "forged.rel", "unsigned.rel"))
    store = os.path.join(tmp, "store")
    run(MKRELEASE, "--new-key", key, pub)
    run(MKRELEASE, "--random", str(M), str(D), "--seed", "3", "--out", signed, "--sign", key)
    run(MKRELEASE, "--random", str(M), str(D), "--seed", "3", "--out", unsigned)
    forge(signed, forged)
    dev = [DEVICE, "--dir", store]
    run(*dev, "init", "--items", str(M))
    run(*dev, "rate", "5", "5")
    run(*dev, "rate", "7", "1")

    # nothing is verified yet: refused; with the key: verified and used; then trusted without it
    run(*dev, "recommend", "3", "--release", signed, expect=1)
    good = items_listed(run(*dev, "recommend", "3", "--release", signed, "--key", pub))
    if len(good) != 3:
        sys.exit(f"FAIL: expected 3 recommendations, got {good}")
    if items_listed(run(*dev, "recommend", "3", "--release", signed)) != good:
        sys.exit("FAIL: the trusted release gave other recommendations without --key")
    run(*dev, "predict", "9", "--release", signed)
    run(*dev, "rate", "11", "3")  # a command that opens the store without the release keeps its trust
    run(*dev, "recommend", "3", "--release", signed)
    run(*dev, "remove", "11")

    # the forged release, by every command, with and without the key
    for args in (["verify", "--release", forged, "--key", pub],
                 ["recommend", "100", "--release", forged, "--key", pub],
                 ["recommend", "100", "--release", forged],
                 ["predict", "42", "--release", forged, "--key", pub],
                 ["predict", "42", "--release", forged]):
        out = run(*dev, *args, expect=1)
        if args[0] == "recommend" and 42 in items_listed(out):
            sys.exit(f"FAIL: the forged item was ranked: {out}")
        if "DPREC_ERR_RELEASE_SIGNATURE" not in out and "DPREC_ERR_RELEASE_UNVERIFIED" not in out:
            sys.exit(f"FAIL: {args}: no signature or verification error in\n{out}")
    # refusing it changed nothing: the signed release is still the trusted one
    if items_listed(run(*dev, "recommend", "3", "--release", signed)) != good:
        sys.exit("FAIL: a refused release changed the trusted one")

    # unsigned: refused with a key, accepted (with a warning) only when told
    out = run(*dev, "recommend", "3", "--release", unsigned, "--key", pub, expect=1)
    if "--insecure-unsigned" not in out:
        sys.exit(f"FAIL: the refusal of an unsigned release does not say how to accept it:\n{out}")
    run(*dev, "verify", "--release", unsigned, expect=2)  # verify needs --key or --insecure-unsigned
    out = run(*dev, "recommend", "3", "--release", unsigned, "--insecure-unsigned")
    if "WITHOUT a signature check" not in out or len(items_listed(out)) != 3:
        sys.exit(f"FAIL: --insecure-unsigned output:\n{out}")
    # every later use of that release says it was never checked, not only the command that trusted it (issue 38)
    for args in (["predict", "9", "--release", unsigned], ["recommend", "3", "--release", unsigned]):
        out = run(*dev, *args)
        if "WITHOUT a signature check" not in out:
            sys.exit(f"FAIL: {args} on a release trusted without a signature check gave no warning:\n{out}")
    # a signed release whose signature is invalid (the forged one) is never taken on --insecure-unsigned: without the
    # key the flag would trust it on its digest, which anyone can recompute
    for args in (["verify", "--release", forged, "--insecure-unsigned"],
                 ["recommend", "100", "--release", forged, "--insecure-unsigned"],
                 ["predict", "42", "--release", forged, "--insecure-unsigned"]):
        out = run(*dev, *args, expect=1)
        if "is signed" not in out or 42 in items_listed(out) or "predicted" in out:
            sys.exit(f"FAIL: {args}: a forged signed release was taken on --insecure-unsigned:\n{out}")

    # 2. one command at a time
    fd = os.open(os.path.join(store, "dprec-ratings.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    t0 = time.monotonic()
    out = run(*dev, "rate", "9", "4", expect=1)
    waited = time.monotonic() - t0
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    if "in use by another client" not in out or waited < 1.0:
        sys.exit(f"FAIL: a locked store: waited {waited:.1f} s, said:\n{out}")
    if "9 4" in run(*dev, "list"):
        sys.exit("FAIL: the refused rating was stored")
    run(*dev, "rate", "9", "4")
    print("device_cli: ok")
