"""Datasets that appear, go and change while mounted: the real dsfs binary, a real redis-server
and a real FUSE mount. A dataset ingested after the mount appears (names the kernel had cached
as missing included), `dsfs rm` makes one vanish, and a re-ingested one keeps its generation
until `dsfs refresh` (or --follow-updates), while a file opened before keeps the bytes of the
generation it was opened in."""
import errno
import json
import os
import random
import unittest

from harness import DsfsTestCase, wait_for

# Large enough to be several objects and several READs: the open file is read across the flip.
BIG = 5 * 1024 * 1024 + 12345
DEADLINE = 30  # seconds; the mounts below poll every 0.2 s


class DatasetChangeTest(DsfsTestCase):
    def generation(self, name):
        return json.loads(self.dsfs("info", name, "--json").stdout)["generation"]

    def write_tree(self, name, seed, files):
        """A source tree of `files` {relative path: size}; returns {path: bytes}."""
        rng = random.Random(seed)
        src = os.path.join(self.tmp, name)
        contents = {}
        for rel, size in files.items():
            path = os.path.join(src, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = rng.randbytes(size)
            with open(path, "wb") as f:
                f.write(data)
            contents[rel] = data
        return src, contents

    @staticmethod
    def datasets_in(directory):
        """The names listed in `directory`, the mount's own dot-directories left out."""
        return sorted(n for n in os.listdir(directory) if not n.startswith("."))

    @staticmethod
    def read(path):
        with open(path, "rb", buffering=0) as f:
            return f.read()

    def test_a_dataset_ingested_after_the_mount_appears_and_rm_removes_it(self):
        src, _ = self.write_tree("first", 1, {"x/a.bin": 1000})
        self.dsfs("ingest", src, "--dataset", "first")
        mnt = self.mount("--watch-interval", "200ms")
        # Looked up before it exists: the kernel caches each miss (for a day).
        self.assertFalse(os.path.exists(os.path.join(mnt, "second")))
        self.assertFalse(os.path.exists(os.path.join(mnt, ".meta", "second")))
        self.assertEqual(self.datasets_in(mnt), ["first"])

        src, contents = self.write_tree("second", 2, {"y/b.bin": 70_000, "y/c.bin": 3})
        self.dsfs("ingest", src, "--dataset", "second")
        wait_for(lambda: os.path.exists(os.path.join(mnt, "second", "y", "b.bin")), DEADLINE,
                 "dataset 'second' to appear in the mount")
        for rel, data in contents.items():
            self.assertEqual(self.read(os.path.join(mnt, "second", rel)), data, rel)
        self.assertEqual(self.datasets_in(mnt), ["first", "second"])
        self.assertEqual(sorted(os.listdir(os.path.join(mnt, ".meta"))), ["first", "second"])
        info = json.loads(self.read(os.path.join(mnt, ".meta", "second", "info.json")))
        self.assertEqual(info["name"], "second")
        # The stats show a change once the kernel was told of it, just after the mount serves it.
        wait_for(lambda: sorted(self.stats(mnt)["datasets"]) == ["first", "second"], DEADLINE,
                 "the stats to list 'second'")
        self.assertEqual(self.stats(mnt)["watch"]["added"], 1)

        # The mount holds a lease on what it serves, so removing it takes --force.
        refused = self.dsfs("rm", "second", "--yes", check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("is mounted", refused.stderr)
        self.dsfs("rm", "second", "--yes", "--force")
        wait_for(lambda: not os.path.exists(os.path.join(mnt, "second")), DEADLINE,
                 "dataset 'second' to vanish from the mount")
        self.assertEqual(self.datasets_in(mnt), ["first"])
        self.assertEqual(sorted(os.listdir(os.path.join(mnt, ".meta"))), ["first"])
        wait_for(lambda: sorted(self.stats(mnt)["datasets"]) == ["first"], DEADLINE,
                 "the stats to list 'first' alone")
        self.assertEqual(self.stats(mnt)["watch"]["removed"], 1)
        # The other dataset is untouched.
        self.assertEqual(len(self.read(os.path.join(mnt, "first", "x", "a.bin"))), 1000)

    def test_refresh_flips_a_reingested_dataset_while_an_open_file_keeps_its_bytes(self):
        src, old = self.write_tree("v1", 3, {"d/big.bin": BIG, "d/small.bin": 500})
        self.dsfs("ingest", src, "--dataset", "ds")
        mnt = self.mount("--watch-interval", "200ms")
        path = os.path.join(mnt, "ds", "d", "big.bin")

        with open(path, "rb", buffering=0) as held:
            head = held.read(100_000)
            self.assertEqual(head, old["d/big.bin"][:100_000])

            # Same names, same sizes, other bytes.
            first = self.generation("ds")
            src2, new = self.write_tree("v2", 4, {"d/big.bin": BIG, "d/small.bin": 500})
            self.dsfs("ingest", src2, "--dataset", "ds")
            second = self.generation("ds")
            # Seen, but not switched to: the mount keeps serving the first generation.
            wait_for(lambda: self.stats(mnt)["watch"]["pending"].get("ds") == second, DEADLINE,
                     "the mount to see the second generation of 'ds' as pending")
            self.assertEqual(self.read(os.path.join(mnt, "ds", "d", "small.bin")),
                             old["d/small.bin"])
            self.assertEqual(self.stats(mnt)["datasets"]["ds"]["generation"], first)

            out = self.dsfs("refresh", mnt, "ds", redis=False)
            self.assertIn(f"ds: generation {first} -> {second}", out.stdout)
            # Opened after the refresh: generation 2 only.
            self.assertEqual(self.read(path), new["d/big.bin"])
            self.assertEqual(self.read(os.path.join(mnt, "ds", "d", "small.bin")),
                             new["d/small.bin"])
            # Opened before: generation 1 to its end, never a byte of generation 2.
            rest = b""
            while chunk := held.read(1 << 20):
                rest += chunk
            self.assertEqual(head + rest, old["d/big.bin"])

        stats = self.stats(mnt)
        self.assertEqual(stats["datasets"]["ds"]["generation"], second)
        self.assertEqual(stats["watch"]["refreshed"], 1)
        self.assertEqual(stats["watch"]["pending"], {})
        again = self.dsfs("refresh", mnt, redis=False)
        self.assertIn(f"ds: generation {second}, already current", again.stdout)

    def test_a_dataset_made_again_after_redis_lost_its_data_never_mixes_into_an_open_file(self):
        # Redis loses everything (the generation counter too) and the dataset is made again:
        # the same names and sizes, other bytes. Its generation used to be 1 again, the same keys:
        # the mount took it for the generation it served, an open file read on into the new
        # bytes (before any pass of the watcher, too: found by an audit), and `dsfs refresh` said
        # "already current".
        src, old = self.write_tree("v1", 5, {"d/big.bin": BIG, "d/small.bin": 500})
        self.dsfs("ingest", src, "--dataset", "ds")
        # No poll of its own within the test: the refresh below is the pass that sees it all.
        mnt = self.mount("--watch-interval", "3600", "--prefetch", "off")
        path = os.path.join(mnt, "ds", "d", "big.bin")
        with open(path, "rb", buffering=0) as held:
            head = held.read(100_000)
            self.assertEqual(head, old["d/big.bin"][:100_000])
            self.redis.cli("FLUSHALL")
            src2, new = self.write_tree("v2", 6, {"d/big.bin": BIG, "d/small.bin": 500})
            self.dsfs("ingest", src2, "--dataset", "ds")
            # Opened before, read on before the mount has looked: its own bytes (what was
            # cached), then EIO; never the new ones.
            rest = b""
            try:
                while chunk := held.read(1 << 20):
                    rest += chunk
            except OSError as e:
                self.assertEqual(e.errno, errno.EIO)
            self.assertEqual(head + rest, old["d/big.bin"][:len(head) + len(rest)])
            self.dsfs("refresh", mnt, "ds", redis=False)
            self.assertEqual(self.read(path), new["d/big.bin"])
            self.assertEqual(self.read(os.path.join(mnt, "ds", "d", "small.bin")),
                             new["d/small.bin"])
            self.assertLess(len(head) + len(rest), BIG)  # its objects are not fetched again
        self.assertEqual(self.stats(mnt)["watch"]["refreshed"], 1)

    def test_refresh_names_what_is_wrong(self):
        src, _ = self.write_tree("v1", 5, {"f.bin": 10})
        self.dsfs("ingest", src, "--dataset", "ds")
        mnt = self.mount("--watch-interval", "0")
        missing = self.dsfs("refresh", mnt, "nosuch", redis=False, check=False)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("dataset 'nosuch' is not published", missing.stderr)
        bad = self.dsfs("refresh", mnt, "bad/name", redis=False, check=False)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("bad/name", bad.stderr)
        not_mount = self.dsfs("refresh", self.tmp, redis=False, check=False)
        self.assertEqual(not_mount.returncode, 1)
        self.assertIn("dsfs mount", not_mount.stderr)
        # With polling off, a new dataset waits for a refresh.
        src2, _ = self.write_tree("other", 6, {"g.bin": 20})
        self.dsfs("ingest", src2, "--dataset", "other")
        self.assertEqual(self.datasets_in(mnt), ["ds"])
        out = self.dsfs("refresh", mnt, redis=False)
        self.assertIn(f"other: appeared (generation {self.generation('other')})", out.stdout)
        self.assertEqual(self.datasets_in(mnt), ["ds", "other"])

    def test_follow_updates_switches_without_a_refresh(self):
        src, old = self.write_tree("v1", 7, {"f.bin": 4000})
        self.dsfs("ingest", src, "--dataset", "ds")
        mnt = self.mount("--watch-interval", "200ms", "--follow-updates")
        path = os.path.join(mnt, "ds", "f.bin")
        self.assertEqual(self.read(path), old["f.bin"])
        src2, new = self.write_tree("v2", 8, {"f.bin": 4000})
        self.dsfs("ingest", src2, "--dataset", "ds")
        second = self.generation("ds")
        wait_for(lambda: self.stats(mnt)["datasets"]["ds"]["generation"] == second, DEADLINE,
                 "the mount to follow 'ds' to its second generation")
        self.assertEqual(self.read(path), new["f.bin"])

    def test_a_mount_of_named_datasets_shows_no_others(self):
        src, _ = self.write_tree("v1", 9, {"f.bin": 10})
        self.dsfs("ingest", src, "--dataset", "mine")
        mnt = self.mount("--dataset", "mine", "--watch-interval", "200ms")
        self.dsfs("ingest", src, "--dataset", "theirs")
        # A pass has run since the ingest: the new dataset was seen and left out.
        passes = self.stats(mnt)["watch"]["passes"]
        wait_for(lambda: self.stats(mnt)["watch"]["passes"] >= passes + 2, DEADLINE,
                 "two more passes of the watcher")
        self.assertEqual(self.datasets_in(mnt), ["mine"])
        self.assertEqual(self.stats(mnt)["watch"]["added"], 0)


if __name__ == "__main__":
    unittest.main()
