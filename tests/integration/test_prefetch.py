"""The prefetch engine through a real mount, a real redis-server and `dsfs proxy --rtt 20ms`:
with a plan, a shuffled epoch is served from objects fetched ahead; without one, a cache of a
tenth of the dataset still hits clearly more often than with prefetching off. Correctness only:
the counters of stats.json, never timings."""
import json
import os
import random
import socket
import threading
import unittest
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from harness import DsfsTestCase, Proxy, wait_for

READERS = 8


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


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


class PrefetchTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        self.dsfs("synth", src, "--classes", "8", "--per-class", "125", "--seed", "3",
                  redis=False)
        self.dsfs("ingest", src, "--dataset", "pf", "--progress", "none")
        self.files = sorted(os.path.relpath(os.path.join(d, f), src)
                            for d, _, names in os.walk(src) for f in names)
        self.expected = {}
        for rel in self.files:
            with open(os.path.join(src, rel), "rb") as f:
                self.expected[rel] = f.read()
        self.dataset_bytes = sum(len(b) for b in self.expected.values())
        self.proxy = Proxy(self.tmp, self.redis, "20ms")

    def tearDown(self):
        super().tearDown()
        self.proxy.stop()

    def mount_through_proxy(self, *extra, name="mnt", proxy=None):
        mnt = os.path.join(self.tmp, name)
        os.makedirs(mnt, exist_ok=True)
        self.dsfs("mount", mnt, "--redis", (proxy or self.proxy).url, *extra, redis=False)
        self.mounts.append(mnt)
        return mnt

    def stats(self, mnt):
        with open(os.path.join(mnt, ".dsfs", "stats.json")) as f:
            return json.load(f)["prefetch"]

    def cache_filled(self, mnt):
        """How full the object cache is, counting what is being fetched into it (0..1)."""
        with open(os.path.join(mnt, ".dsfs", "stats.json")) as f:
            cache = json.load(f)["cache"]
        return (cache["bytes"] + cache["reserved_bytes"]) / cache["capacity_bytes"]

    def read_epoch(self, mnt, order):
        """Reads every file of `order` with READERS threads, checking the bytes; returns the
        prefetch counters of the reads this epoch made."""
        drop_page_cache()
        before = self.stats(mnt)["reads"]

        def read(rel):
            with open(os.path.join(mnt, "pf", rel), "rb") as f:
                data = f.read()
            self.assertEqual(data, self.expected[rel], rel)

        with ThreadPoolExecutor(READERS) as pool:
            list(pool.map(read, order))
        after = self.stats(mnt)["reads"]
        return {k: after[k] - before[k] for k in ("ready", "joined", "miss")}

    def test_planned_shuffled_epochs_are_served_from_objects_fetched_ahead(self):
        mnt = self.mount_through_proxy("--cache-size", str(self.dataset_bytes // 4))
        # Several epochs, a new order each: objects still cached from the last epoch must be kept
        # for this one's plan, not evicted as already read (they once were: 3.5% missed).
        for epoch in range(3):
            order = self.files[:]
            random.Random(epoch).shuffle(order)
            with open(os.path.join(mnt, ".dsfs", "plan"), "w") as f:
                f.write("".join(f"pf/{rel}\n" for rel in order))
            stats = self.stats(mnt)
            self.assertEqual(stats["plan"]["entries"], len(order))
            self.assertEqual(stats["plan"]["unresolved"], 0)
            self.assertEqual(stats["leader"], "plan")
            # The control that makes this hold on a slow (ASan, loaded) machine: readers start
            # once the plan's head is cached, as a loader's first batch would find it.
            wait_for(lambda: self.cache_filled(mnt) >= 0.9, 120, "the plan's head to be cached")
            reads = self.read_epoch(mnt, order)
            total = sum(reads.values())
            self.assertGreaterEqual(total, len(order))
            hit = (reads["ready"] + reads["joined"]) / total
            # 0.97: the regression this guards (kept objects evicted as already read) missed
            # 3.5%; a reader briefly outrunning the fetches on a loaded machine misses less.
            self.assertGreaterEqual(hit, 0.97, f"plan epoch {epoch + 1}: {reads}")
            after = self.stats(mnt)
            self.assertEqual(after["plan"]["position"], len(order))
            self.assertEqual(after["epoch"], epoch + 1)
        self.assertGreater(after["rtt_ms"], 15)  # it measured the proxy's 20 ms
        # 20 ms away slow start grew the window past its floor (2 per connection), never past
        # its maximum (half the cache in files; a file's chunks go out together).
        inflight = after["inflight"]
        self.assertGreater(inflight["peak"], 16, inflight)
        # A planned order 20 ms away opened the window at once from the first replies (issue
        # 17), and the link's own round trip stayed the measure of it.
        self.assertGreater(inflight["fetches_opened_for_plan"], 0, inflight)
        self.assertGreater(inflight["base_rtt_ms"], 15, inflight)
        self.assertGreater(inflight["burst_per_s"], 0, inflight)
        self.assertLessEqual(inflight["peak"], inflight["max"] + 8, inflight)
        # One server is one node: its window is the engine's (issue 12's per-node windows).
        self.assertEqual([n["address"] for n in after["nodes"]], [f"127.0.0.1:{self.proxy.port}"])
        self.assertEqual(after["nodes"][0]["opened_for_plan"], inflight["fetches_opened_for_plan"])

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

    def test_without_a_plan_a_small_cache_beats_prefetching_off(self):
        cache = str(self.dataset_bytes // 10)
        hit_rates = {}
        for mode in ("off", "auto"):
            mnt = self.mount_through_proxy("--prefetch", mode, "--cache-size", cache, name=mode)
            totals = {"ready": 0, "joined": 0, "miss": 0}
            for epoch in range(3):
                order = self.files[:]
                random.Random(100 + epoch).shuffle(order)
                reads = self.read_epoch(mnt, order)
                if epoch > 0:  # the first epoch starts from an empty cache for both
                    for k in totals:
                        totals[k] += reads[k]
            hit_rates[mode] = (totals["ready"] + totals["joined"]) / sum(totals.values())
            stats = self.stats(mnt)
            if mode == "auto":
                self.assertEqual(stats["leader"], "unread-set")
                self.assertGreaterEqual(stats["epoch"], 3)
            else:
                self.assertEqual(stats["bytes"]["prefetched"], 0)
            self.umount(mnt)
        # The order-blind bound for k/N = 0.1 is 0.1 (1 + ln 10) = 0.33; LRU gets about 0.1.
        print(f"\nhit rates of epochs 2-3, cache 10%: {hit_rates}")
        self.assertGreater(hit_rates["auto"], hit_rates["off"] + 0.1, hit_rates)


if __name__ == "__main__":
    unittest.main()
