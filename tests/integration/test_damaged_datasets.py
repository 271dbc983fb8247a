"""One damaged dataset must not break the others (issue 11, item 8), end to end: the real dsfs
binary, a real redis-server whose keys a test damages by hand, and a real FUSE mount.
`dsfs list` shows the damage beside the healthy datasets, a mount of all datasets serves the
healthy ones (same bytes as ingested) and names the skipped one as it mounts, `dsfs rm` removes
the damaged one, and names the mount reserves are refused at ingest."""
import json
import os
import unittest

from harness import DsfsTestCase


class DamagedDatasetTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.tmp, "src")
        self.files = {}
        for cls in ("cat", "dog"):
            os.makedirs(os.path.join(self.src, cls))
            for i in range(3):
                rel = f"{cls}/{i}.jpg"
                data = os.urandom(1000 + 37 * i) + rel.encode()
                with open(os.path.join(self.src, rel), "wb") as f:
                    f.write(data)
                self.files[rel] = data
        for name in ("good", "broken"):
            self.dsfs("ingest", self.src, "--dataset", name)

    def damage(self, kind):
        info = "dsfs:{broken}:info"
        if kind == "wrongtype":
            self.redis.cli("DEL", info)
            self.redis.cli("SET", info, "not a hash")
        elif kind == "corrupt-field":
            self.redis.cli("HSET", info, "generation", "x\x1b[2J")
        elif kind == "corrupt-manifest":
            generation = self.redis.cli("HGET", info, "generation").strip()
            self.redis.cli("SETRANGE", f"dsfs:{{broken}}:manifest:{generation}:0", "5", "XXXX")
        else:
            raise ValueError(kind)

    def assert_serves_good_only(self, mnt):
        self.assertEqual(sorted(n for n in os.listdir(mnt) if not n.startswith(".")), ["good"])
        for rel, data in self.files.items():
            with open(os.path.join(mnt, "good", rel), "rb") as f:
                self.assertEqual(f.read(), data, rel)

    def test_list_mount_and_rm_survive_each_kind_of_damage(self):
        for kind in ("wrongtype", "corrupt-field", "corrupt-manifest"):
            with self.subTest(kind=kind):
                if kind != "wrongtype":
                    self.dsfs("ingest", self.src, "--dataset", "broken")
                self.damage(kind)
                listing = self.dsfs("list")
                rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
                self.assertIn("good", rows)
                self.assertNotIn("damaged", rows["good"])
                if kind != "corrupt-manifest":  # a bad checksum is found by loading it
                    self.assertIn("damaged:", rows["broken"])
                    self.assertNotIn("\x1b", listing.stdout)
                    by_name = {d["name"]: d for d in json.loads(self.dsfs("list", "--json").stdout)}
                    self.assertEqual(by_name["good"]["file_count"], len(self.files))
                    self.assertIn("damaged", by_name["broken"])

                mnt = os.path.join(self.tmp, f"mnt-{kind}")
                os.makedirs(mnt)
                res = self.dsfs("mount", mnt)
                self.mounts.append(mnt)
                self.assertIn("dataset 'broken' skipped", res.stderr)
                self.assertNotIn("\x1b", res.stderr)
                self.assert_serves_good_only(mnt)
                # The skipped dataset holds no lease, so rm needs no --force while mounted.
                self.dsfs("rm", "broken")
                self.assertNotIn("broken", self.dsfs("list").stdout)
                self.assert_serves_good_only(mnt)
                self.umount(mnt)

    def test_a_name_in_the_set_that_is_not_valid_is_skipped_not_fatal(self):
        """A member of NS:datasets that is no valid name, with an info hash (written by hand or
        by another tool): the mount of every dataset failed with "invalid dataset name" (an
        error type the skipping did not catch), and so did the watcher's every pass and
        `dsfs refresh`. It is skipped as damaged now, the others served."""
        self.dsfs("rm", "broken")
        fields = self.redis.cli("HGETALL", "dsfs:{good}:info").splitlines()
        self.redis.cli("HSET", "dsfs:{*}:info", *fields)
        self.redis.cli("SADD", "dsfs:datasets", "*")
        mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(mnt)
        res = self.dsfs("mount", mnt)
        self.mounts.append(mnt)
        self.assertIn("not a valid dataset name", res.stderr)
        self.assert_serves_good_only(mnt)
        # A refresh of all reports the damage (EIO, as for any damaged dataset); the watcher
        # still refreshes the others and sees a new dataset.
        self.assertNotEqual(self.dsfs("refresh", mnt, redis=False, check=False).returncode, 0)
        self.dsfs("refresh", mnt, "good", redis=False)
        self.dsfs("ingest", self.src, "--dataset", "later")
        self.dsfs("refresh", mnt, "later", redis=False)
        self.assertIn("later", os.listdir(mnt))

    def test_mounting_a_damaged_dataset_by_name_is_an_error_naming_it(self):
        self.damage("wrongtype")
        mnt = os.path.join(self.tmp, "named")
        os.makedirs(mnt)
        res = self.dsfs("mount", mnt, "--dataset", "broken", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("dataset 'broken'", res.stderr)
        self.assertIn("dsfs rm broken", res.stderr)

    def test_reserved_names_are_refused_at_ingest(self):
        for name in (".views", ".meta", ".dsfs", ".anything"):
            res = self.dsfs("ingest", self.src, "--dataset", name, check=False)
            self.assertNotEqual(res.returncode, 0, name)
            self.assertIn("is reserved", res.stderr, name)
        names = self.redis.cli("SMEMBERS", "dsfs:datasets").split()
        self.assertEqual(sorted(names), ["broken", "good"])


if __name__ == "__main__":
    unittest.main()
