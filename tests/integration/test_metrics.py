"""`dsfs mount --metrics-listen`: the mount's counters for Prometheus over HTTP. The real dsfs
binary, a real redis-server and a real FUSE mount; the text is read by Debian's
python3-prometheus-client parser, and its figures are checked against what the test read and
against MOUNT/.dsfs/stats.json."""
import math
import os
import random
import socket
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness import DsfsTestCase, free_port, is_mounted, mount_stats

CLASSES = 2
FILES_PER_CLASS = 12


class MetricsTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        rng = random.Random(15)
        self.files = []
        for c in range(CLASSES):
            os.makedirs(os.path.join(src, f"c{c}"))
            for i in range(FILES_PER_CLASS):
                rel = os.path.join(f"c{c}", f"{i:03d}.jpg")
                with open(os.path.join(src, rel), "wb") as f:
                    f.write(rng.randbytes(rng.randint(1000, 150_000)))
                self.files.append(rel)
        self.total_bytes = sum(os.path.getsize(os.path.join(src, rel)) for rel in self.files)
        self.dsfs("ingest", src, "--dataset", "ds")

    def mount_with_metrics(self, *extra, name="mnt"):
        """Mounts with --metrics-listen on a free loopback port; returns (mountpoint, port). A
        port free_port() found may be taken before the mount binds it: then another is tried."""
        for _ in range(5):
            port = free_port()
            mnt = os.path.join(self.tmp, name)
            os.makedirs(mnt, exist_ok=True)
            res = self.dsfs("mount", mnt, "--metrics-listen", f"127.0.0.1:{port}", *extra,
                            check=False)
            if res.returncode == 0:
                self.mounts.append(mnt)
                self.assertTrue(is_mounted(mnt))
                return mnt, port
            self.assertIn("already in use", res.stderr, res.stderr)
        self.fail("no free port for --metrics-listen in 5 tries")

    @staticmethod
    def get(port, path="/metrics"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
            return reply.status, reply.headers, reply.read().decode()

    def scrape(self, port):
        """{family name: Metric} of one scrape, checking the exposition's shape on the way."""
        status, headers, text = self.get(port)
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"),
                        headers["Content-Type"])
        families = {}
        for family in text_string_to_metric_families(text):
            # A sample outside its family's TYPE comes back untyped and undocumented.
            self.assertNotEqual(family.type, "untyped", family.name)
            self.assertTrue(family.documentation, f"{family.name} has no # HELP")
            self.assertTrue(family.name.startswith("dsfs_"), family.name)
            self.assertNotIn(family.name, families, "family twice")
            families[family.name] = family
        return families

    @staticmethod
    def value(families, family, sample=None, **labels):
        """The value of the sample named `sample` (default: the family's own name, or
        NAME_total for a counter) with exactly `labels`."""
        metric = families[family]
        if sample is None:
            sample = family + "_total" if metric.type == "counter" else family
        found = [s.value for s in metric.samples if s.name == sample and s.labels == labels]
        if len(found) != 1:
            raise AssertionError(f"{sample}{labels}: {len(found)} samples in {metric.samples}")
        return found[0]

    def check_histogram(self, families, name):
        """Buckets ascending in le and cumulative, ending in +Inf which equals _count."""
        metric = families[name]
        self.assertEqual(metric.type, "histogram")
        buckets = [(float(s.labels["le"]), s.value) for s in metric.samples
                   if s.name == name + "_bucket"]
        self.assertGreater(len(buckets), 10)
        les = [le for le, _ in buckets]
        self.assertEqual(les, sorted(set(les)), "le ascending, each once")
        self.assertTrue(math.isinf(les[-1]), "the last bucket is +Inf")
        counts = [count for _, count in buckets]
        for before, after in zip(counts, counts[1:]):
            self.assertLessEqual(before, after, f"buckets not cumulative: {buckets}")
        count = self.value(families, name, name + "_count")
        self.assertEqual(counts[-1], count)
        self.assertGreaterEqual(self.value(families, name, name + "_sum"), 0)
        return count

    def test_counters_match_what_was_read(self):
        mnt, port = self.mount_with_metrics()
        before = self.scrape(port)
        read_before = self.value(before, "dsfs_read_bytes")
        read = 0
        for rel in self.files:
            with open(os.path.join(mnt, "ds", rel), "rb") as f:
                read += len(f.read())
        self.assertEqual(read, self.total_bytes)

        families = self.scrape(port)
        stats = mount_stats(mnt)
        bytes_read = self.value(families, "dsfs_read_bytes")
        self.assertGreaterEqual(bytes_read - read_before, read)
        files_read = self.value(families, "dsfs_files_read")
        self.assertGreaterEqual(files_read, len(self.files))
        # The same sources as stats.json: nothing was read between the two.
        self.assertEqual(bytes_read, stats["bytes_read"])
        self.assertEqual(files_read, stats["files_read"])
        # (Not compared with stats.json: the prefetch engine may fetch between the two reads.)
        self.assertGreater(self.value(families, "dsfs_redis_round_trips"), 0)
        self.assertGreaterEqual(self.value(families, "dsfs_fuse_requests", op="read"),
                                len(self.files))
        self.assertEqual(self.value(families, "dsfs_fuse_errors", kind="integrity"), 0)

        outcomes = {o: self.value(families, "dsfs_prefetch_reads", outcome=o)
                    for o in ("ready", "joined", "miss")}
        for outcome, n in outcomes.items():
            self.assertEqual(n, stats["prefetch"]["reads"][outcome], outcome)
        stalls = self.check_histogram(families, "dsfs_read_stall_seconds")
        self.assertEqual(stalls, sum(outcomes.values()), "one stall observed per READ")
        self.assertGreaterEqual(stalls, len(self.files))

        self.assertEqual(self.value(families, "dsfs_dataset_files", dataset="ds"),
                         len(self.files))
        self.assertEqual(self.value(families, "dsfs_dataset_bytes", dataset="ds"),
                         self.total_bytes)
        capacity = self.value(families, "dsfs_cache_capacity_bytes")
        self.assertGreater(capacity, 0)
        self.assertLessEqual(self.value(families, "dsfs_cache_bytes"), capacity)
        self.assertGreater(self.value(families, "dsfs_view_cache_capacity_bytes"), 0)
        self.assertFalse([n for n in families if n.startswith("dsfs_disk_cache")],
                         "disk-tier metrics without a disk tier")

    def test_other_paths_are_404(self):
        _, port = self.mount_with_metrics()
        for path in ("/", "/metricsx", "/metrics/", "/stats.json"):
            with self.assertRaises(urllib.error.HTTPError) as caught:
                self.get(port, path)
            self.assertEqual(caught.exception.code, 404, path)
            caught.exception.close()
        self.assertEqual(self.get(port)[0], 200)

    def test_a_taken_port_or_bad_address_fails_the_mount(self):
        _, port = self.mount_with_metrics()
        second = os.path.join(self.tmp, "second")
        os.makedirs(second)
        for listen, expected in ((f"127.0.0.1:{port}", "already in use"),
                                 (str(port), "already in use"),
                                 ("192.0.2.1:9464", "no such address"),
                                 (":9464", "HOST:PORT"),
                                 ("127.0.0.1:99999", "from 1 to 65535")):
            res = self.dsfs("mount", second, "--metrics-listen", listen, check=False)
            self.assertNotEqual(res.returncode, 0, listen)
            self.assertIn("--metrics-listen", res.stderr, listen)
            self.assertIn(expected, res.stderr, listen)
            self.assertFalse(is_mounted(second), f"{listen}: mounted all the same")
        self.assertEqual(self.get(port)[0], 200, "the first mount still serves")

    def test_disk_tier_metrics_when_one_is_on(self):
        _, port = self.mount_with_metrics("--disk-cache", os.path.join(self.tmp, "disk"),
                                          "--disk-cache-size", "64MiB")
        families = self.scrape(port)
        self.assertEqual(self.value(families, "dsfs_disk_cache_capacity_bytes"), 64 << 20)
        self.assertEqual(self.value(families, "dsfs_disk_cache_checksum_failures"), 0)
        self.assertEqual(self.value(families, "dsfs_disk_cache_direct_reads"), 0)
        self.assertEqual(self.value(families, "dsfs_disk_cache_page_cache_reads"), 0)

    def test_a_stuck_client_does_not_hold_up_unmount(self):
        mnt, port = self.mount_with_metrics()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stuck:
            stuck.sendall(b"GET /metr")  # and never the rest
            self.umount(mnt)
            try:
                answer = stuck.recv(100)
            except ConnectionResetError:  # closed while still waiting to be accepted
                answer = b""
            self.assertEqual(answer, b"", "the daemon closed it without an answer")
        # The port is free again once the daemon has gone: a new mount binds it.
        again = os.path.join(self.tmp, "again")
        os.makedirs(again)
        self.dsfs("mount", again, "--metrics-listen", str(port))
        self.mounts.append(again)
        self.assertEqual(self.get(port)[0], 200)
