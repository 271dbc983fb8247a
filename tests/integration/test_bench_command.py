"""`dsfs bench PATH` end to end: the real binary on a temp tree and on a dsfs mount of the same
files (counts, bytes, JSON well-formed and adding up, errors and exit statuses), and the raw Redis
reader (bench/redis_raw.cpp) on the same dataset when it is built next to the dsfs binary."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

from harness import DSFS, DsfsTestCase, chars_read, run, signal_handled, wait_for

RAW_READER = os.path.join(os.path.dirname(DSFS), "bench", "dsfs_bench_redis_raw")


def make_tree(root):
    """A small nested tree of files of assorted sizes (one empty, one of several MiB); returns
    {relative path: size}."""
    sizes = {}
    layout = {"class_a/x.bin": 1000, "class_a/y.bin": 4096, "class_a/deep/z.bin": 70000,
              "class_b/one.bin": 0, "class_b/two.bin": 123457, "class_b/three.bin": 5 << 20,
              "top.txt": 17}
    for rel, size in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        sizes[rel] = size
    return sizes


def bench(*args, check=True, **kw):
    return run([DSFS, "bench"] + [str(a) for a in args], check=check, **kw)


class BenchJsonChecks:
    def check_consistent(self, report, files, total_bytes, epochs):
        totals = report["totals"]
        self.assertEqual(report["config"]["listed_files"], files)
        self.assertEqual(report["config"]["listed_bytes"], total_bytes)
        self.assertEqual(totals["files"], files * epochs)
        self.assertEqual(totals["bytes"], total_bytes * epochs)
        self.assertEqual(totals["errors"], 0)
        self.assertEqual(len(report["epochs"]), epochs)
        for i, epoch in enumerate(report["epochs"]):
            self.assertEqual(epoch["epoch"], i)
            self.assertTrue(epoch["complete"])
            self.assertEqual(epoch["files"], files)
            self.assertEqual(epoch["bytes"], total_bytes)
        self.assertEqual(sum(s["files"] for s in report["timeline"]), totals["files"])
        self.assertEqual(sum(s["bytes"] for s in report["timeline"]), totals["bytes"])
        lat = totals["latency_ms"]
        self.assertEqual(lat["count"], totals["files"])
        self.assertLessEqual(lat["min"], lat["p50"])
        self.assertLessEqual(lat["p50"], lat["p90"])
        self.assertLessEqual(lat["p90"], lat["p99"])
        self.assertLessEqual(lat["p99"], lat["max"])
        self.assertGreater(totals["seconds"], 0)


class BenchTreeTest(unittest.TestCase, BenchJsonChecks):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsfs-bench-")
        self.root = os.path.join(self.tmp, "tree")
        self.sizes = make_tree(self.root)
        self.files = len(self.sizes)
        self.bytes = sum(self.sizes.values())

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_every_pattern_counts_files_and_bytes(self):
        for pattern in ["seq", "shuffle", "epochs"]:
            with self.subTest(pattern=pattern):
                out = os.path.join(self.tmp, f"{pattern}.json")
                res = bench(self.root, "--pattern", pattern, "--epochs", 3, "--jobs", 3,
                            "--json", out)
                with open(out) as f:
                    report = json.load(f)
                self.check_consistent(report, self.files, self.bytes, 3)
                self.assertEqual(report["config"]["pattern"], pattern)
                self.assertEqual(report["config"]["jobs"], 3)
                self.assertIn("read: files/s=", res.stdout)
                self.assertIn("lat (ms): p50=", res.stdout)
                self.assertIn("epoch 2:", res.stdout)
                self.assertEqual(res.stderr, "", "no progress line when stderr is not a tty")

    def test_json_to_stdout_keeps_the_summary_on_stderr(self):
        res = bench(self.root, "--json", "-", "--bs", "4k")
        report = json.loads(res.stdout)
        self.check_consistent(report, self.files, self.bytes, 1)
        self.assertEqual(report["config"]["block_size"], 4096)
        self.assertIsNone(report["config"]["epochs"])
        self.assertIn("read: files/s=", res.stderr)

    def test_files_cap_takes_the_first_in_sorted_order(self):
        res = bench(self.root, "--files", 3, "--pattern", "shuffle", "--json", "-")
        report = json.loads(res.stdout)
        first_three = sorted(self.sizes, key=lambda p: p.encode())[:3]
        self.check_consistent(report, 3, sum(self.sizes[p] for p in first_three), 1)

    def test_duration_without_epochs_repeats_epochs_until_it_ends(self):
        res = bench(self.root, "--duration", "300ms", "--json", "-")
        report = json.loads(res.stdout)
        self.assertEqual(report["config"]["duration_s"], 0.3)
        epochs = report["epochs"]
        self.assertGreaterEqual(len(epochs), 1)
        for epoch in epochs[:-1]:
            self.assertTrue(epoch["complete"])
            self.assertEqual(epoch["files"], self.files)
        self.assertEqual(sum(e["files"] for e in epochs), report["totals"]["files"])
        self.assertEqual(sum(e["bytes"] for e in epochs), report["totals"]["bytes"])
        self.assertEqual(sum(s["files"] for s in report["timeline"]), report["totals"]["files"])

    def test_unreadable_entry_is_counted_and_exits_1(self):
        os.symlink(os.path.join(self.tmp, "nowhere"), os.path.join(self.root, "broken"))
        res = bench(self.root, "--epochs", 2, "--json", "-", check=False)
        self.assertEqual(res.returncode, 1, res.stderr)
        report = json.loads(res.stdout)
        self.assertEqual(report["totals"]["errors"], 2)
        self.assertEqual(report["errors"]["count"], 2)
        self.assertEqual(report["totals"]["files"], self.files * 2)
        first = report["errors"]["first"][0]
        self.assertEqual(first["path"], os.path.join(self.root, "broken"))
        self.assertEqual(first["operation"], "open")
        self.assertIn("No such file", first["message"])
        self.assertIn("2 error(s)", res.stderr)

    def test_nothing_to_read_exits_2_naming_the_path(self):
        missing = os.path.join(self.tmp, "missing")
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(os.path.join(empty, "sub"))
        not_dir = os.path.join(self.root, "top.txt")
        for path, words in [(missing, "No such file"), (empty, "no files to read"),
                            (not_dir, "not a directory")]:
            with self.subTest(path=path):
                res = bench(path, check=False)
                self.assertEqual(res.returncode, 2, res.stderr)
                self.assertIn(path, res.stderr)
                self.assertIn(words, res.stderr)
                self.assertEqual(res.stdout, "")

    def test_bad_options_are_refused(self):
        for args in [["--jobs", "0"], ["--pattern", "random"], ["--epochs", "0"],
                     ["--bs", "0"], ["--duration", "0"], ["--duration", "soon"]]:
            with self.subTest(args=args):
                res = bench(self.root, *args, check=False)
                self.assertNotEqual(res.returncode, 0)
                self.assertEqual(res.stdout, "")
        res = bench(self.root, "--json", os.path.join(self.tmp, "no", "dir", "x.json"),
                    check=False)
        self.assertEqual(res.returncode, 2)
        self.assertIn("--json", res.stderr)

    def test_sigint_prints_what_was_read_and_exits_130(self):
        out = os.path.join(self.tmp, "interrupted.json")
        proc = subprocess.Popen([DSFS, "bench", self.root, "--duration", "120s", "--json", out],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Its handler is in and at least a tree's worth of file bytes were read (more than the
        # loader's reads): the report must then count files.
        wait_for(lambda: signal_handled(proc.pid, signal.SIGINT)
                 and chars_read(proc.pid) > self.bytes + (1 << 20), 60, "dsfs bench to read")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 130, stderr)
        self.assertIn("read: files/s=", stdout)
        with open(out) as f:
            report = json.load(f)
        self.assertGreater(report["totals"]["files"], 0)
        # Stopped by the signal, not by --duration: the signal may land between two epochs of
        # this small tree, so the last one may have completed (CI hit that race once).
        self.assertLess(report["totals"]["seconds"], 60)
        self.assertTrue(report["epochs"])

    @unittest.skipUnless(os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK),
                         "--drop-caches needs root and a writable /proc/sys/vm/drop_caches")
    def test_drop_caches_drops_the_page_cache_before_every_epoch(self):
        def drops():  # the kernel's count of page-cache drops (any process's)
            with open("/proc/vmstat") as f:
                for line in f:
                    name, value = line.split()
                    if name == "drop_pagecache":
                        return int(value)
            self.skipTest("/proc/vmstat has no drop_pagecache counter")

        before = drops()
        res = bench(self.root, "--epochs", 3, "--drop-caches", "--json", "-")
        report = json.loads(res.stdout)
        self.check_consistent(report, self.files, self.bytes, 3)
        self.assertTrue(report["config"]["drop_caches"])
        self.assertIn("page cache dropped before each epoch", res.stderr)
        self.assertGreaterEqual(drops() - before, 3)

    def test_plan_outside_a_mount_exits_2_before_reading(self):
        res = bench(self.root, "--plan", "--json", "-", check=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--plan", res.stderr)
        self.assertIn(self.root, res.stderr)
        self.assertIn(".dsfs/stats.json", res.stderr)
        self.assertEqual(res.stdout, "")

    def test_help_explains_the_options(self):
        res = bench("--help")
        for option in ["--pattern", "--epochs", "--jobs", "--files", "--bs", "--duration",
                       "--seed", "--json", "--drop-caches", "--plan"]:
            self.assertIn(option, res.stdout)


class BenchMountTest(DsfsTestCase, BenchJsonChecks):
    """The same files read from a dsfs mount give the same counts and bytes as from disk."""

    def test_mount_matches_the_source_tree(self):
        source = os.path.join(self.tmp, "src")
        sizes = make_tree(source)
        self.dsfs("ingest", source, "--dataset", "ds", "--labels", "none")
        mnt = self.mount("--timeout", "5s")
        disk = json.loads(bench(source, "--pattern", "epochs", "--epochs", 2, "--jobs", 2,
                                "--json", "-").stdout)
        mounted = json.loads(bench(os.path.join(mnt, "ds"), "--pattern", "epochs", "--epochs",
                                   2, "--jobs", 2, "--json", "-").stdout)
        for report in (disk, mounted):
            self.check_consistent(report, len(sizes), sum(sizes.values()), 2)

        if not os.path.exists(RAW_READER):
            self.skipTest(f"{RAW_READER} is not built")
        out = os.path.join(self.tmp, "raw.json")
        run([RAW_READER, "--redis", self.redis.url, "--dataset", "ds", "--jobs", "2",
             "--pipeline", "4", "--epochs", "2", "--json", out])
        with open(out) as f:
            raw = json.load(f)
        self.assertEqual(raw["totals"]["files"], len(sizes) * 2)
        self.assertEqual(raw["totals"]["bytes"], sum(sizes.values()) * 2)
        self.assertEqual(raw["totals"]["errors"], 0)
        self.assertEqual(set(raw["totals"]), set(mounted["totals"]),
                         "the raw reader's totals use dsfs bench's field names")

    def test_plan_hands_the_engine_each_epochs_order(self):
        """--plan on a real mount: the engine holds a plan of every file before each epoch,
        resolves every line, and follows it (the plan leads, or nearly every read hits)."""
        source = os.path.join(self.tmp, "src")
        files = 300
        for i in range(files):
            path = os.path.join(source, f"class_{i % 3}", f"img_{i:04d}.bin")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(os.urandom(2000 + 37 * i))
        self.dsfs("ingest", source, "--dataset", "ds", "--labels", "none")
        mnt = self.mount("--timeout", "5s", "--prefetch", "auto")
        # From a directory below the dataset too: the mount is found above PATH.
        for root, count in ((os.path.join(mnt, "ds"), files),
                            (os.path.join(mnt, "ds", "class_1"), files // 3)):
            with self.subTest(root=root):
                res = bench(root, "--pattern", "epochs", "--epochs", 2, "--jobs", 4, "--plan",
                            "--seed", 11, "--json", "-")
                report = json.loads(res.stdout)
                self.assertEqual(report["totals"]["files"], 2 * count)
                self.assertEqual(report["totals"]["errors"], 0)
                self.assertTrue(report["config"]["plan"])
                for epoch in report["epochs"]:
                    self.assertGreaterEqual(epoch["plan_seconds"], 0)
                self.assertIn("written to the mount's plan", res.stderr)
                with open(os.path.join(mnt, ".dsfs", "stats.json")) as f:
                    prefetch = json.load(f)["prefetch"]
                self.assertEqual(prefetch["plan"]["entries"], count, prefetch["plan"])
                self.assertEqual(prefetch["plan"]["unresolved"], 0, prefetch["plan"])
                # Handed over whole (above); how well the engine then follows it is a figure
                # for bench/prefetch.sh, not a test (the last epoch reads from the page cache).

    def test_raw_reader_counts_a_wrong_length_as_an_error(self):
        if not os.path.exists(RAW_READER):
            self.skipTest(f"{RAW_READER} is not built")
        source = os.path.join(self.tmp, "src")
        sizes = make_tree(source)
        self.dsfs("ingest", source, "--dataset", "ds", "--labels", "none")
        small_keys = [k for k in self.redis.cli("--scan", "--pattern", "dsfs:ds:*:o:*").split()
                      if k.count(":") == 4]
        self.redis.cli("SET", small_keys[0], "not the stored bytes")
        res = run([RAW_READER, "--redis", self.redis.url, "--dataset", "ds", "--json",
                   os.path.join(self.tmp, "raw.json")], check=False)
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn(small_keys[0], res.stdout)
        with open(os.path.join(self.tmp, "raw.json")) as f:
            raw = json.load(f)
        self.assertEqual(raw["totals"]["errors"], 1)
        self.assertEqual(raw["totals"]["files"], len(sizes) - 1)


if __name__ == "__main__":
    unittest.main()
