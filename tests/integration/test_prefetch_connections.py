"""How the prefetch engine uses its connections, seen at a real redis-server through `dsfs proxy`
(issue 17): the fetch workers connect before the first read, and a planned order goes out over
every connection in small batches. Correctness only: which connection sent each GET, never
timings. Apart from test_prefetch.py so that each stays well within ctest's time limit under
ASan."""
import os
import random
import socket
import threading
import unittest
from collections import defaultdict

from harness import Proxy, wait_for
from test_prefetch import PrefetchCase


class RespConnection:
    """A plain RESP client on one socket, for what redis-cli cannot do here: keep MONITOR open
    while the test runs, and GET a thousand values without a process each."""

    def __init__(self, redis):
        self.sock = socket.create_connection(("127.0.0.1", redis.port), timeout=30)
        self.file = self.sock.makefile("rb")
        if redis.password:
            self.call("AUTH", redis.password)

    def send(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(parts))

    def reply(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("Redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args):
        self.send(*args)
        return self.reply()

    def close(self):
        self.file.close()
        self.sock.close()


class GetMonitor:
    """Records, through MONITOR, which client connection sent each GET, until stop()."""

    def __init__(self, redis):
        self.conn = RespConnection(redis)
        self.conn.call("MONITOR")
        self.gets = []  # (client address, key), in the order Redis ran them
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while True:
                # 1764201234.123456 [0 127.0.0.1:54321] "GET" "dsfs:pf:1:o:42"
                line = self.conn.reply()
                _, _, rest = line.partition(" [")
                client, _, command = rest.partition("] ")
                words = command.split(" ")
                if len(words) == 2 and words[0] == '"GET"':
                    self.gets.append((client.split(" ", 1)[1], words[1].strip('"')))
        except (OSError, ValueError, ConnectionError):
            pass  # stop() closed the socket

    def stop(self):
        self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        self.conn.close()
        return self.gets


def longest_run(positions):
    """The most consecutive positions (p, p + 1, ...) that follow one another in `positions`."""
    best = run = 0
    for i, p in enumerate(positions):
        run = run + 1 if i > 0 and p == positions[i - 1] + 1 else 1
        best = max(best, run)
    return best


class PrefetchConnectionsTest(PrefetchCase):
    def test_a_planned_order_goes_out_over_every_connection_in_small_batches(self):
        # Replies on one connection come back in the order sent, and the connections share the
        # path. A fetch worker once took as many planned files as the window had room for (500
        # here), so the readers' next file waited behind them on one connection while the
        # others' replies, files far ahead, took their share (issue 17). Each takes at most 16.
        # 100 ms: the window opens to a few hundred at once even on a slow (ASan) build.
        far = Proxy(self.tmp, self.redis, "100ms")
        try:
            mnt = self.mount_through_proxy(name="far", proxy=far)  # the default cache holds it
            order = self.files[:]
            random.Random(7).shuffle(order)
            monitor = GetMonitor(self.redis)
            try:
                with open(os.path.join(mnt, ".dsfs", "plan"), "w") as f:
                    f.write("".join(f"pf/{rel}\n" for rel in order))
                # No reader: every GET is the engine's, in the plan's order.
                wait_for(lambda: self.stats(mnt)["gets"] >= len(order) // 2, 120,
                         "half the plan to be fetched ahead")
                fetched = self.stats(mnt)["gets"]
                wait_for(lambda: len(monitor.gets) >= fetched, 60, "MONITOR to show those GETs")
            finally:
                gets = monitor.stop()
            inflight = self.stats(mnt)["inflight"]
        finally:
            far.stop()
        # Which file each object key holds, from the values themselves.
        rel_of = {}
        by_bytes = {data: rel for rel, data in self.expected.items()}
        conn = RespConnection(self.redis)
        try:
            cursor = "0"
            while True:
                cursor, keys = conn.call("SCAN", cursor, "MATCH", "dsfs:pf:*:o:*", "COUNT", "1000")
                for key in keys:
                    rel_of[key.decode()] = by_bytes[conn.call("GET", key)]
                if cursor == b"0":
                    break
        finally:
            conn.close()
        self.assertEqual(len(rel_of), len(self.files))
        position = {rel: i for i, rel in enumerate(order)}
        sent = defaultdict(list)  # each connection's planned positions, in the order sent
        for client, key in gets:
            if key in rel_of:
                sent[client].append(position[rel_of[key]])
        self.assertGreaterEqual(sum(map(len, sent.values())), len(order) // 2)
        # The window opened wide: a worker could have taken hundreds at once ...
        peak = inflight["peak"]
        self.assertGreaterEqual(peak, 200, inflight)
        # ... and consecutive planned files went out over several connections. Before, one
        # connection carried them all (617 in a row, peak 984). Now a worker takes 16 at a time
        # up to about its share of the windows (an eighth, + 16); a run on one connection is
        # batches it took before another worker woke (up to 169 seen, peak 907).
        runs = {client: longest_run(p) for client, p in sent.items()}
        print(f"\npeak {peak}, longest runs of planned files per connection: "
              f"{sorted(runs.values(), reverse=True)}")
        self.assertGreaterEqual(len(sent), 4, runs)
        self.assertLessEqual(max(runs.values()), peak // 2, runs)

    def test_the_prefetch_workers_connect_before_the_first_read(self):
        # Far from Redis a new connection waits round trips (handshake, AUTH) before its first
        # GET goes out. The engine's 8 workers connect when the mount starts, so a first epoch's
        # opening GETs wait one round trip, not three (issue 17). Before, a mount held 2.
        def clients():
            info = self.redis.cli("INFO", "clients")
            return int(next(line.split(":")[1] for line in info.splitlines()
                            if line.startswith("connected_clients:")))

        before = clients()
        mnt = self.mount_through_proxy()
        wait_for(lambda: clients() - before >= 8 + 1, 60, "the prefetch workers to connect")
        self.assertEqual(self.stats(mnt)["accesses"], 0)  # no read asked for them
        self.assertEqual(self.stats(mnt)["gets"], 0)


if __name__ == "__main__":
    unittest.main()
