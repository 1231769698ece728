#!/usr/bin/env python3
"""Connections an attacker cannot hold, and requests whose framing two parsers could read differently (issue 37),
against the HTTPS front end that `dprec-aggregator serve` and `dprec-relay serve` share, over real TLS on loopback.
One check per attack; ctest runs each against each server. Numbers are small and bounded; nothing is timed: a wait
has a bound past which the check fails, and the bounds are the documented timeouts plus slack.

usage: front_end_attacks.py PATH/TO/dprec-aggregator|dprec-relay CHECK      (CHECK: framing, slow_head, budget, all)
The aggregator's state is on SQLite, or on PostgreSQL with DPREC_TEST_STATE=postgresql (tests/serve_util.py; ctest
runs framing, the check that looks at what was stored, on both); the relay's is SQLite, its only engine.
Exits 0 when every check passed, 1 with the failed ones listed.
"""
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agg_hardening as H  # noqa: E402  (the Server harness; it takes the binary from argv[1] too)
import serve_util  # noqa: E402  (the aggregator's state engine: DPREC_TEST_STATE)

check = H.check
RELAY = "relay" in os.path.basename(H.BIN)


def exchange(srv, data, listener="device", source=None, wait=10):
    """Sends data on a fresh TLS connection and reads until the server closes it (or wait seconds pass).
    Returns (bytes read, closed by the server)."""
    s = H.tls_socket(srv, listener, source, timeout=wait)
    out, closed = b"", False
    try:
        s.sendall(data)
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                closed = True
                break
            out += chunk
    except (OSError, ValueError):
        closed = True  # a reset (or a TLS close without close_notify) is a close too
    finally:
        s.close()
    return out, closed


def statuses(raw):
    """The status codes of the HTTP/1.1 responses in raw, in order (status lines at the start of a response)."""
    codes, rest = [], raw
    while rest.startswith(b"HTTP/1.1 "):
        codes.append(int(rest[9:12]))
        head, sep, rest = rest.partition(b"\r\n\r\n")
        if not sep:
            break
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v.strip())
        rest = rest[n:]
    return codes


def devices(srv):
    if RELAY:
        return None
    return int(serve_util.state_query(srv.state, "SELECT count(*) FROM devices"))


REG = "POST /v1/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def check_framing(tmp):
    """Duplicate or conflicting Content-Length, Content-Length with Transfer-Encoding (a request smuggled behind it),
    a Transfer-Encoding that is not chunked, a header name with a space before its colon: 400 bad_framing, the
    connection closed, nothing served. Before: the first two registered a device and the smuggled request was
    answered."""
    srv = H.Server(tmp).start()
    n0 = devices(srv)
    cases = [
        ("two equal Content-Lengths", REG + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}"),
        ("two conflicting Content-Lengths", REG + "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}"),
        ("Content-Length and Transfer-Encoding: chunked, a request smuggled behind",
         REG + "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
               "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("Transfer-Encoding: chunked then Content-Length", REG + "Transfer-Encoding: chunked\r\nContent-Length: 7\r\n\r\n"
                                                           "2\r\n{}\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("Transfer-Encoding: gzip", REG + "Transfer-Encoding: gzip\r\n\r\n{}"),
        ("Transfer-Encoding: chunked twice", REG + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
                                                   "2\r\n{}\r\n0\r\n\r\n"),
        ("a space before the colon", REG + "Content-Length : 2\r\n\r\n{}"),
    ]
    for what, req in cases:
        out, closed = exchange(srv, req.encode())
        codes = statuses(out)
        check(codes == [400] and b'"bad_framing"' in out and closed,
              "%s: one 400 bad_framing, then the connection closed (%s, closed %s: %r)" % (what, codes, closed,
                                                                                          out[:60]))
    # Content-Length: -1 and +2 are refused by libmicrohttpd itself before any callback of ours (its 400 page, whose
    # header block 0.9.75 writes twice: docs/operations.md "Framing"); what is checked is that nothing is served
    for v in ("-1", "+2", "0x10"):
        out, closed = exchange(srv, (REG + "Content-Length: %s\r\n\r\n{}GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" % v)
                               .encode())
        check(out.startswith(b"HTTP/1.1 400 ") and closed and b'"status":"ok"' not in out and b"201 " not in out,
              "Content-Length: %s: 400, closed, nothing served (closed %s: %r)" % (v, closed, out[:40]))
    if not RELAY:
        check(devices(srv) == n0, "no device was registered by any of them (%s, was %s)" % (devices(srv), n0))
    # what is well framed still works: a chunked body, and two pipelined requests on one connection
    if not RELAY:
        out, _ = exchange(srv, (REG + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
                          .encode())
        check(statuses(out) == [201], "a chunked registration is served (%s)" % statuses(out))
    out, _ = exchange(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n"
                           b"Connection: close\r\n\r\n")
    check(statuses(out) == [200, 200], "two pipelined requests are both answered (%s)" % statuses(out))
    text = srv.request("admin", "GET", "/metrics")[2].decode()
    n = H.metric(text, 'dprec_http_refused_total{limit="bad_framing"}')
    check(n is not None and n >= len(cases), "dprec_http_refused_total{limit=\"bad_framing\"} counts them (%s)" % n)
    check(srv.stop() == 0, "the server stops cleanly (under ASan: no leak, no error)")
    lines = [l for l in srv.log_lines() if '"event":"bad_framing"' in l]
    check(1 <= len(lines) <= 2 and '"client":"127.0.0.1"' in lines[0],
          "one bad_framing warn line (rate-limited), with the client's address (%d)" % len(lines))


def trickle(srv, first, line, every, limit, out, key, listener="device"):
    """Opens a TLS connection, sends first, then line every `every` seconds; records in out[key] how many lines went
    before the server closed the connection (None: still open after `limit` seconds)."""
    try:
        s = H.tls_socket(srv, listener, timeout=10)
    except OSError as e:
        out[key] = "connect failed: %r" % e
        return
    t0 = time.time()
    sent = 0
    try:
        s.sendall(first)
        if first.endswith(b"\r\n\r\n"):
            H.read_http_response(s)  # the first request's answer: the connection is now idle between requests
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and the next head starts
        s.settimeout(every)
        while time.time() - t0 < limit:
            try:
                if s.recv(4096) == b"":  # anything read (an answer, a TLS alert) is read past; the end is the close
                    out[key] = sent
                    return
                continue
            except socket.timeout:
                pass
            s.sendall(line)
            sent += 1
        out[key] = None
    except (OSError, ValueError):
        out[key] = sent
    finally:
        s.close()


def check_slow_head(tmp):
    """A head sent one line a second is closed at its deadline, which its bytes do not move: the handshake and the
    first head within handshake_timeout (3 s here), a later head within connection_timeout (4 s here) of the previous
    answer. Before: each line restarted libmicrohttpd's idle timer and the connection was held for ever."""
    srv = H.Server(tmp, args=["--handshake-timeout", "3", "--connection-timeout", "4"]).start()
    out = {}
    ts = [threading.Thread(target=trickle, args=(srv, b"GET /healthz HTTP/1.1\r\n", b"X-A: b\r\n", 1.0, 20, out,
                                                 "first head %d" % i)) for i in range(5)]
    ts += [threading.Thread(target=trickle, args=(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                                  b"X-A: b\r\n", 1.0, 20, out, "second head")),
           threading.Thread(target=trickle, args=(srv, b"GET /healthz HTTP/1.1\r\n", b"X-A: b\r\n", 1.0, 20, out,
                                                  "admin first head", "admin"))]
    idle = [socket.create_connection(("127.0.0.1", srv.port("device")), timeout=5) for i in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in sorted(out):
        check(isinstance(out[k], int) and out[k] <= 8,
              "%s sent a line a second: closed by the server after %s line(s) (bound 8; None: held 20 s)" % (k, out[k]))
    # plain TCP that never starts TLS: closed too
    left = 0
    for s in idle:
        s.settimeout(5)
        try:
            while s.recv(4096) != b"":  # a TLS alert may come before the close
                pass
        except socket.timeout:
            left += 1
        except OSError:
            pass
        s.close()
    check(left == 0, "connections that never start TLS are closed (%d of 5 left)" % left)
    status, _, _ = srv.request("device", "GET", "/healthz")
    check(status == 200, "a client that sends its head at once is served meanwhile (%s)" % status)
    text = srv.request("admin", "GET", "/metrics")[2].decode()
    n = H.metric(text, 'dprec_http_connections_closed_total{reason="head_timeout"}')
    check(n is not None and n >= 7, "dprec_http_connections_closed_total{reason=\"head_timeout\"} counts the trickled "
          "heads (%s)" % n)
    check(srv.stop() == 0, "the server stops cleanly (under ASan: no leak, no error)")
    lines = [l for l in srv.log_lines() if '"event":"connection_closed"' in l and '"head_timeout"' in l]
    check(len(lines) >= 1, "a connection_closed warn line says why (%d)" % len(lines))


def check_budget(tmp):
    """Connections that say nothing, from many addresses each under its per-address limit, fill connection_limit
    (60 here, from 6 addresses x 10); a new client is still served at once, as the connection that waited longest
    for a head makes room. Before: the new client waited for a slot until the flood's handshake timeout (60 s
    here)."""
    srv = H.Server(tmp, config={"connection_limit": 60, "connections_per_address": 10,
                                "handshake_timeout": 60}).start()
    port = srv.port("device")
    flood = []
    for a in range(2, 8):
        for i in range(10):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                      source_address=("127.0.0.%d" % a, 0)))
            except OSError:
                pass
    time.sleep(0.5)
    for round_ in range(2):
        try:
            status, _, _ = srv.request("device", "GET", "/healthz", source="127.0.0.100", timeout=8)
        except Exception as e:  # timed out: the flood held every slot
            status = repr(e)
        check(status == 200, "with %d silent connections opened, a new client is served (round %d: %s)" %
              (len(flood), round_ + 1, status))
        # the flood comes back from 6 other addresses: as many fresh connections again
        for a in range(8 + 6 * round_, 14 + 6 * round_):
            for i in range(10):
                try:
                    flood.append(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                          source_address=("127.0.0.%d" % a, 0)))
                except OSError:
                    pass
        time.sleep(0.5)
    text = srv.request("admin", "GET", "/metrics", timeout=8)[2].decode()
    n = H.metric(text, 'dprec_http_connections_closed_total{reason="budget"}')
    check(n is not None and n >= 60, "dprec_http_connections_closed_total{reason=\"budget\"} counts the displaced (%s)" %
          n)
    conns = H.metric(text, "dprec_http_connections")
    check(conns is not None and conns <= 60 + 60 // 8 + 64 + 2,
          "open connections stay within the budget and its headroom (%s)" % conns)
    for s in flood:
        s.close()
    check(srv.stop() == 0, "the server stops cleanly (under ASan: no leak, no error)")
    lines = [l for l in srv.log_lines() if '"event":"connection_closed"' in l and '"budget"' in l]
    check(len(lines) >= 1, "a connection_closed warn line (reason budget) says so (%d)" % len(lines))


CHECKS = {"framing": check_framing, "slow_head": check_slow_head, "budget": check_budget}


def main():
    if len(sys.argv) < 3 or (sys.argv[2] not in CHECKS and sys.argv[2] != "all"):
        print(__doc__)
        sys.exit(2)
    names = sorted(CHECKS) if sys.argv[2] == "all" else [sys.argv[2]]
    for name in names:
        tmp = tempfile.mkdtemp(prefix="dprec-fe-")
        before = len(H.FAILS)
        try:
            print("== %s (%s)" % (name, os.path.basename(H.BIN)), flush=True)
            CHECKS[name](tmp)
        except (SystemExit, Exception) as e:  # an exception is a failed check, never a crash of the runner
            H.FAILS.append("%s: %r" % (name, e))
            print("FAIL %r" % e)
        finally:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log") and len(H.FAILS) > before:
                    with open(os.path.join(tmp, f), "rb") as fh:
                        print("---- %s (tail) ----" % f)
                        print(fh.read()[-3000:].decode(errors="replace"))
            for p in H.SERVERS:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            del H.SERVERS[:]
            shutil.rmtree(tmp, ignore_errors=True)
    if H.FAILS:
        print("%d check(s) failed" % len(H.FAILS))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
