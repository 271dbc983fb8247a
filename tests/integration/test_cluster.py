"""dsfs on a real Redis Cluster (issue 12): 3 primaries + 3 replicas started with
`dsfs server start --shards 3 --replicas 1` in the test's own DSFS_HOME. Ingest spreads objects
over every primary and a mount reads them back byte for byte; `dsfs rm` leaves no key on any
node; slots moving between primaries while 8 readers stream (page cache dropped after each file,
a cache smaller than the data) give zero errors and zero wrong bytes; a primary killed mid-read
is replaced by its replica and reads go on, and with --read-from replica no read fails at all
and the primaries serve (almost) no GETs."""
import json
import os
import re
import subprocess
import threading
import time
import unittest

from harness import DSFS, run, wait_for, is_mounted
from test_soak_faults import Readers, synth_dataset

import tempfile
import shutil

CACHE_BYTES = 8 << 20


def cli(port, *args, check=True):
    out = subprocess.run(["redis-cli", "-p", str(port), *map(str, args)], capture_output=True,
                         text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"redis-cli -p {port} {' '.join(map(str, args))}: {out.stderr}")
    return out.stdout.strip()


class ClusterTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsfs-cluster-")
        self.env = dict(os.environ, DSFS_HOME=os.path.join(self.tmp, "home"))
        self.env.pop("DSFS_REDIS", None)
        self.mounts = []
        run([DSFS, "server", "start", "--shards", "3", "--replicas", "1"], env=self.env)
        self.primaries, self.replicas = self.nodes()
        self.assertEqual(len(self.primaries), 3)
        self.assertEqual(len(self.replicas), 3)
        self.url = f"redis://127.0.0.1:{self.primaries[0]}"

    def tearDown(self):
        for mnt in reversed(self.mounts):
            if is_mounted(mnt):
                subprocess.run([DSFS, "umount", mnt], capture_output=True)
            if is_mounted(mnt):
                subprocess.run(["umount", "-l", mnt], capture_output=True)
        subprocess.run([DSFS, "server", "stop"], env=self.env, capture_output=True, timeout=120)
        # A node killed by a test is not running; any left over by a failure is stopped here.
        for port in self.primaries + self.replicas:
            subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"],
                           capture_output=True, timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def nodes(self):
        """(primary ports, replica ports) from a node's own view."""
        status = run([DSFS, "server", "status"], env=self.env).stdout
        ports = sorted({int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", status)})
        primaries, replicas = [], []
        for port in ports:
            role = cli(port, "ROLE").splitlines()[0]
            (primaries if role == "master" else replicas).append(port)
        return primaries, replicas

    def dsfs(self, *args, check=True, **kw):
        return run([DSFS, *map(str, args), "--redis", self.url], check=check, env=self.env, **kw)

    def mount(self, *extra, name="mnt"):
        mnt = os.path.join(self.tmp, name)
        os.makedirs(mnt, exist_ok=True)
        self.dsfs("mount", mnt, "--cache-size", CACHE_BYTES, *extra)
        self.mounts.append(mnt)
        self.assertTrue(is_mounted(mnt))
        return mnt

    def ingest(self, seed=11):
        src = os.path.join(self.tmp, "src")
        expected = synth_dataset(src, seed=seed)
        self.dsfs("ingest", src, "--dataset", "ds", "--chunk-size", "1MiB")
        return expected

    def get_calls(self, port):
        stats = cli(port, "INFO", "commandstats")
        m = re.search(r"cmdstat_get:calls=(\d+)", stats)
        return int(m.group(1)) if m else 0

    def test_ingest_spreads_objects_and_a_mount_reads_every_byte(self):
        expected = self.ingest()
        sizes = [int(cli(p, "DBSIZE")) for p in self.primaries]
        mean = sum(sizes) / len(sizes)
        self.assertTrue(all(s > 0 for s in sizes), sizes)
        self.assertLessEqual(max(sizes), 1.5 * mean, f"keys per primary: {sizes}")
        info = self.dsfs("info", "ds").stdout
        self.assertIn("cluster primaries:   3", info)
        spread = json.loads(self.dsfs("info", "ds", "--json").stdout)["nodes"]
        self.assertEqual(sorted(n["address"] for n in spread),
                         sorted(f"127.0.0.1:{p}" for p in self.primaries))
        self.assertEqual(sum(n["bytes"] for n in spread), sum(s for s, _ in expected.values()))
        mnt = self.mount()
        readers = Readers(mnt, "ds", expected)
        readers.run_pass()
        self.assertEqual(readers.wrong, [])
        self.assertEqual(sum(readers.errors.values()), 0, dict(readers.errors))
        self.assertEqual(readers.ok_files, len(expected))
        subprocess.run([DSFS, "umount", mnt], check=True, capture_output=True)
        self.mounts.remove(mnt)
        self.dsfs("rm", "ds", "--force")
        left = {p: cli(p, "KEYS", "dsfs:*") for p in self.primaries}
        self.assertTrue(all(not keys or keys == "dsfs:datasets" for keys in left.values()), left)

    def test_slots_moving_while_eight_readers_stream_lose_nothing(self):
        expected = self.ingest()
        mnt = self.mount("--prefetch", "auto")
        readers = Readers(mnt, "ds", expected)
        readers.start()
        try:
            wait_for(lambda: readers.snapshot()["ok_files"] >= 50, 60, "readers under way")
            ids = {p: cli(p, "CLUSTER", "MYID") for p in self.primaries}
            # Move a third of a primary's slots to the next one, and back, while reading.
            for src, dst in [(0, 1), (1, 2), (2, 0)]:
                run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{self.primaries[0]}",
                     "--cluster-from", ids[self.primaries[src]],
                     "--cluster-to", ids[self.primaries[dst]],
                     "--cluster-slots", "1500", "--cluster-yes"], timeout=300)
            moved_at = readers.snapshot()["ok_files"]
            wait_for(lambda: readers.snapshot()["ok_files"] >= moved_at + 50, 60,
                     "reads after the resharding")
        finally:
            self.assertTrue(readers.stop(60), "a reader hung")
        self.assertEqual(readers.wrong, [])
        self.assertEqual(sum(readers.errors.values()), 0, dict(readers.errors))
        self.assertGreater(readers.ok_files, 100)

    def test_a_primary_killed_mid_read_is_replaced_and_replica_reads_never_fail(self):
        expected = self.ingest()
        for port in self.primaries + self.replicas:
            cli(port, "CONFIG", "SET", "cluster-node-timeout", "2000")
        # Replicas are listed once they have replicated something; wait until each is.
        wait_for(lambda: cli(self.primaries[0], "CLUSTER", "SLOTS").count("127.0.0.1") >= 6,
                 30, "replicas listed in CLUSTER SLOTS")
        from_replicas = self.mount("--read-from", "replica", "--timeout", "30s",
                                   name="replica-mnt")
        from_primaries = self.mount("--timeout", "30s", name="primary-mnt")
        calls_before = {p: self.get_calls(p) for p in self.primaries}
        replica_readers = Readers(from_replicas, "ds", expected, seed=3)
        replica_readers.run_pass()
        self.assertEqual(sum(replica_readers.errors.values()), 0)
        served = sum(self.get_calls(p) - calls_before[p] for p in self.primaries)
        self.assertLessEqual(served, len(expected) // 20,
                             f"primaries served {served} GETs with --read-from replica")

        replica_readers = Readers(from_replicas, "ds", expected, seed=4)
        primary_readers = Readers(from_primaries, "ds", expected, seed=5)
        replica_readers.start()
        primary_readers.start()
        try:
            wait_for(lambda: primary_readers.snapshot()["ok_files"] >= 30, 60, "reads under way")
            victim = self.primaries[1]
            cli(victim, "SHUTDOWN", "NOSAVE", check=False)
            killed_at = time.monotonic()
            # Its replica is promoted: some other node now owns its slots.
            wait_for(lambda: len([p for p in self.primaries + self.replicas if p != victim
                                  and cli(p, "ROLE", check=False).startswith("master")]) == 3,
                     60, "the replica's promotion")
            after = primary_readers.snapshot()["ok_files"]
            wait_for(lambda: primary_readers.snapshot()["ok_files"] >= after + 100, 60,
                     "reads from primaries after the failover")
            print(f"failover: reads went on {time.monotonic() - killed_at:.1f} s after the kill")
        finally:
            self.assertTrue(primary_readers.stop(60), "a reader of the primaries hung")
            self.assertTrue(replica_readers.stop(60), "a reader of the replicas hung")
        self.assertEqual(primary_readers.wrong, [])
        self.assertEqual(replica_readers.wrong, [])
        self.assertEqual(sum(primary_readers.errors.values()), 0, dict(primary_readers.errors))
        self.assertEqual(sum(replica_readers.errors.values()), 0, dict(replica_readers.errors))


if __name__ == "__main__":
    unittest.main()
