#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How long the metrics endpoint keeps a scraper out after (or during) a flood of idle, slow,
closed or garbage connections from many loopback source addresses (127.0.0.2 and up, which any
local user may bind).

Each run starts its own vased (VASED, default build/vased) on a free port, makes the flood, then
scrapes again and again (a fresh connection each time, 1 s to answer) until one scrape gets an
HTTP response, and prints the seconds from the end of the flood to that response, or "never"
after --limit seconds. Medians over --runs runs per scenario. Not part of `make check`: a
measurement, not a test.

    tests/bench_metrics_flood.py [--runs 5] [--limit 30] [--scenario closed,held,...]
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SCENARIOS = {
    # name: (connections, source addresses, what each connection does, held during the scrape)
    "closed": (16, 4, "idle", False),  # the wedge: accepted, then closed
    "expired": (16, 4, "idle", "expired"),  # held until the daemon drops them, then closed
    "held": (256, 64, "idle", True),  # 4 per address from 64 addresses, never sending
    "slow": (64, 64, "slow", True),  # a request's first bytes, then nothing
    "garbage": (64, 64, "garbage", True),  # bytes that never end a request line
    # 4 per address from 64 addresses, each reopened as soon as the daemon closes it
    "churn": (256, 64, "idle", "churn"),
}


DROPPED = []  # "expired": seconds until the daemon had closed the idle connections


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vased(vased, port):
    d = tempfile.mkdtemp(prefix="vase-bench-metrics.")
    open(os.path.join(d, "vased.conf"), "w").close()
    log = open(os.path.join(d, "vased.log"), "w")
    p = subprocess.Popen(
        [vased, "--runtime-dir=" + d, "--config=" + d + "/vased.conf", "--arena-bytes=1M",
         "--granule-bytes=4096", "--evictor-threads=1",
         "--metrics-address=127.0.0.1:%d" % port],
        stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if scrape(port, 0.2):
            return p, d
        time.sleep(0.05)
    p.kill()
    raise SystemExit("vased did not serve metrics on port %d (see %s/vased.log)" % (port, d))


def scrape(port, timeout):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
            c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            return c.recv(16).startswith(b"HTTP/1.")
    except OSError:
        return False


def flood(port, n, k, what):
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind(("127.0.0.%d" % (2 + i % k), 0))
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    time.sleep(0.5)  # connected (and accepted, where the daemon takes them)
    for s in socks:
        try:
            if what == "slow":
                s.send(b"GET /metr")
            elif what == "garbage":
                s.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        except OSError:
            pass
    return socks


def wait_dropped(socks, limit):
    """Waits until the daemon has closed every one of socks; the seconds that took."""
    t0 = time.monotonic()
    end = t0 + limit
    for s in socks:
        while time.monotonic() < end:
            try:
                if s.recv(64) == b"":
                    break
            except BlockingIOError:
                time.sleep(0.02)
            except OSError:
                break
    return time.monotonic() - t0


def churn(port, socks, k, stop):
    """Reopens every connection of socks the daemon has closed, until stop is set."""
    while not stop.is_set():
        for i, s in enumerate(socks):
            try:
                if s.recv(64) != b"":
                    continue
            except BlockingIOError:
                continue
            except OSError:
                pass
            s.close()
            n = socket.socket()
            n.setblocking(False)
            n.bind(("127.0.0.%d" % (2 + i % k), 0))
            try:
                n.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                pass
            socks[i] = n
        time.sleep(0.01)


def run_once(vased, name, limit):
    n, k, what, held = SCENARIOS[name]
    port = free_port()
    p, d = start_vased(vased, port)
    try:
        socks = flood(port, n, k, what)
        stop = threading.Event()
        t = None
        if held == "expired":
            DROPPED.append(wait_dropped(socks, limit))
        elif held == "churn":
            t = threading.Thread(target=churn, args=(port, socks, k, stop))
            t.start()
        if held is False or held == "expired":
            for s in socks:
                s.close()
        t0 = time.monotonic()
        took = None
        while time.monotonic() - t0 < limit:
            if scrape(port, 1.0):
                took = time.monotonic() - t0
                break
            time.sleep(0.05)
        stop.set()
        if t:
            t.join()
        for s in socks:
            s.close()
        return took
    finally:
        p.terminate()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vased", default=os.environ.get("VASED", "build/vased"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--limit", type=float, default=30.0)
    ap.add_argument("--scenario", default=",".join(SCENARIOS))
    a = ap.parse_args()
    for name in a.scenario.split(","):
        times = [run_once(a.vased, name, a.limit) for _ in range(a.runs)]
        ok = [t for t in times if t is not None]
        shown = " ".join("never" if t is None else "%.2f" % t for t in times)
        if len(ok) * 2 > len(times):
            med = "median %.2f s" % statistics.median(
                [t if t is not None else float("inf") for t in times])
        else:
            med = "median: never within %.0f s" % a.limit
        n, k, what, held = SCENARIOS[name]
        print("%-8s %3d %s connections from %2d addresses, %s: %s  (runs: %s)" %
              (name, n, what, k, {True: "held", False: "closed", "expired": "closed once dropped",
               "churn": "reopened when dropped"}[held], med, shown))
        if held == "expired":
            print("         the daemon dropped them after: median %.2f s  (runs: %s)" %
                  (statistics.median(DROPPED), " ".join("%.2f" % t for t in DROPPED)))
            DROPPED.clear()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
