"""The prefetch engine's user-facing tools through a real mount: `dsfs plan` (replace, --append,
unresolved lines, refusals), `dsfs stats` (summary, --json, --watch), and dsfs_torch's
PlanSampler and write_plan with a torchvision ImageFolder and a multi-worker DataLoader."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
import zlib

import torch
from torch.utils.data import DataLoader, RandomSampler
from torchvision import datasets

from harness import DSFS, DsfsTestCase, mount_stats, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python"))
import dsfs_torch  # noqa: E402


def file_crc(path):
    """An ImageFolder loader that returns the file's CRC-32: what was read, cheaply."""
    with open(path, "rb") as f:
        return zlib.crc32(f.read())


def prefetch_stats(mnt):
    stats = mount_stats(mnt)
    if "prefetch" not in stats:
        raise AssertionError("stats.json has no prefetch section: the engine is not there")
    return stats["prefetch"]


class MountedDatasetCase(DsfsTestCase):
    """A small synthetic ImageFolder tree (3 classes x 8), ingested as `tv` and mounted."""

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.tmp, "src")
        run([DSFS, "synth", self.src, "--classes", "3", "--per-class", "8", "--seed", "4"])
        self.dsfs("ingest", self.src, "--dataset", "tv")
        self.mnt = self.mount()
        self.files = sorted(os.path.relpath(os.path.join(d, f), self.src)
                            for d, _, names in os.walk(self.src) for f in names)
        self.plan_paths = [f"tv/{p}" for p in self.files]

    def write_list(self, name, lines):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        return path


class PlanCommandTest(MountedDatasetCase):
    def test_refuses_a_directory_that_is_not_a_mount(self):
        paths = self.write_list("paths.txt", self.plan_paths)
        res = self.dsfs("plan", self.tmp, paths, check=False, redis=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn(f"{self.tmp} is not a dsfs mount", res.stderr)
        self.assertIn(".dsfs/stats.json", res.stderr)
        # A dataset directory inside the mount: the message names the mount to give instead.
        res = self.dsfs("plan", os.path.join(self.mnt, "tv"), paths, check=False, redis=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn(f"inside the dsfs mount {self.mnt}", res.stderr)
        res = self.dsfs("stats", self.tmp, check=False, redis=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("is not a dsfs mount", res.stderr)
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], 0)

    def test_replaces_appends_and_counts_unresolved_lines(self):
        n = len(self.plan_paths)
        first = self.write_list("first.txt", self.plan_paths[:10])
        res = self.dsfs("plan", self.mnt, first, redis=False)
        self.assertIn("wrote 10 path(s)", res.stdout)
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], 10)

        # Replacing: absolute paths inside the mount, CRLF line ends and blank lines are fine.
        text = "".join(f"{os.path.join(self.mnt, p)}\r\n\n" for p in self.plan_paths)
        res = self.dsfs("plan", self.mnt, "-", input=text, redis=False)
        self.assertIn(f"wrote {n} path(s)", res.stdout)
        plan = prefetch_stats(self.mnt)["plan"]
        self.assertEqual((plan["entries"], plan["unresolved"]), (n, 0))

        res = self.dsfs("plan", self.mnt, first, "--append", redis=False)
        self.assertIn("appended 10 path(s)", res.stdout)
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], n + 10)

        bogus = ["tv/class_0000/no_such_file.JPEG", "nodataset/x.jpg", "tv/class_0001"]
        self.dsfs("plan", self.mnt, "-", "--append", input="\n".join(bogus) + "\n", redis=False)
        plan = prefetch_stats(self.mnt)["plan"]
        self.assertEqual(plan["unresolved"], len(bogus))
        self.assertEqual(plan["entries"], n + 10)

        # A path outside the mount: refused, naming the line, and the plan is left as it was.
        outside = self.write_list("outside.txt", self.plan_paths[:3] + ["/etc/passwd"])
        res = self.dsfs("plan", self.mnt, outside, check=False, redis=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("line 4: /etc/passwd is not under the mount", res.stderr)
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], n + 10)

    def test_an_empty_file_clears_the_plan(self):
        # Opening the plan with O_TRUNC and writing nothing (`: > MOUNT/.dsfs/plan`) empties it.
        self.dsfs("plan", self.mnt, self.write_list("paths.txt", self.plan_paths + ["tv/x"]),
                  redis=False)
        plan = prefetch_stats(self.mnt)["plan"]
        self.assertEqual((plan["entries"], plan["unresolved"]), (len(self.plan_paths), 1))
        empty = self.write_list("empty.txt", [])
        res = self.dsfs("plan", self.mnt, empty, redis=False)
        self.assertIn("cleared the plan", res.stdout)
        plan = prefetch_stats(self.mnt)["plan"]
        self.assertEqual((plan["entries"], plan["unresolved"]), (0, 0))

    def test_a_missing_input_file_is_an_error(self):
        res = self.dsfs("plan", self.mnt, os.path.join(self.tmp, "missing.txt"), check=False,
                        redis=False)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("cannot read", res.stderr)
        self.assertIn("missing.txt", res.stderr)


class StatsCommandTest(MountedDatasetCase):
    def test_summary_json_and_watch(self):
        for rel in self.files:  # some reads, so the figures are not all zero
            with open(os.path.join(self.mnt, "tv", rel), "rb") as f:
                f.read()
        res = self.dsfs("stats", self.mnt, redis=False)
        leader = prefetch_stats(self.mnt)["leader"]
        self.assertRegex(res.stdout, rf"(?m)^prefetch +mode \S+  leader {leader}  epoch \d+$")
        self.assertRegex(res.stdout, r"(?m)^reads +hit [0-9.]+%  ready ")
        self.assertRegex(res.stdout, r"(?m)^cache +[0-9.]+ [KMG]?B of ")
        self.assertNotIn("predates the engine", res.stdout)

        raw = json.loads(self.dsfs("stats", self.mnt, "--json", redis=False).stdout)
        self.assertIn("prefetch", raw)
        self.assertIn("cache", raw)

        # --watch into a pipe: one block per interval, rates from the second on; SIGINT ends it
        # with status 0.
        proc = subprocess.Popen([DSFS, "stats", self.mnt, "--watch", "--interval", "0.2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killer = threading.Timer(60, proc.kill)  # never hang the suite
        killer.start()
        try:
            blocks = 0
            rates = []
            for line in proc.stdout:
                if line.startswith("dsfs stats "):
                    blocks += 1
                    self.assertNotIn("\x1b[", line, "no ANSI codes into a pipe")
                if line.startswith("rates"):
                    rates.append(line)
                if len(rates) >= 3:
                    break
            proc.send_signal(signal.SIGINT)
            proc.stdout.read()
            self.assertEqual(proc.wait(timeout=30), 0, proc.stderr.read())
        finally:
            killer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        self.assertGreaterEqual(blocks, 3)
        self.assertIn("after the first interval", rates[0])
        self.assertRegex(rates[1], r"reads/s  [0-9.]+ MB/s  hit ")


class PlanSamplerTest(MountedDatasetCase):
    def test_each_epoch_plans_its_order_before_a_two_worker_loader_reads_it(self):
        on_mount = datasets.ImageFolder(os.path.join(self.mnt, "tv"), loader=file_crc)
        reference = datasets.ImageFolder(self.src, loader=file_crc)
        self.assertEqual(len(on_mount), len(self.files))
        sampler = dsfs_torch.PlanSampler(
            RandomSampler(on_mount, generator=torch.Generator().manual_seed(11)))
        self.assertEqual(os.path.realpath(sampler.mount), os.path.realpath(self.mnt))
        self.assertEqual(len(sampler), len(on_mount))
        # The same draws on the source tree: the order each epoch must follow.
        twin = RandomSampler(reference, generator=torch.Generator().manual_seed(11))
        loader = DataLoader(on_mount, batch_size=5, sampler=sampler, num_workers=2)

        written = []
        original_write = dsfs_torch._write_lines

        def recording_write(mount, lines, append):
            written.append(list(lines))
            return original_write(mount, lines, append)

        dsfs_torch._write_lines = recording_write
        try:
            orders = []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                expected = list(twin)
                orders.append(expected)
                batches = iter(loader)  # the sampler draws and writes the plan here
                self.assertEqual(len(written), epoch + 1)
                self.assertEqual(written[-1], [f"tv/{os.path.relpath(reference.samples[i][0], self.src)}"
                                               for i in expected])
                plan = prefetch_stats(self.mnt)["plan"]
                self.assertEqual(plan["entries"], len(on_mount), f"epoch {epoch}")
                self.assertEqual(plan["unresolved"], 0, f"epoch {epoch}")
                crcs, labels = [], []
                for crc, label in batches:
                    crcs += crc.tolist()
                    labels += label.tolist()
                self.assertEqual(labels, [reference.samples[i][1] for i in expected])
                self.assertEqual(crcs, [reference[i][0] for i in expected])
            self.assertNotEqual(orders[0], orders[1], "a shuffling sampler reshuffles each epoch")
        finally:
            dsfs_torch._write_lines = original_write

    def test_write_plan_and_explicit_paths(self):
        n = dsfs_torch.write_plan(self.mnt, [os.path.join(self.mnt, p) for p in self.plan_paths])
        self.assertEqual(n, len(self.plan_paths))
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], n)
        dsfs_torch.write_plan(self.mnt, self.plan_paths[:4], append=True)
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], n + 4)
        self.assertEqual(dsfs_torch.write_plan(self.mnt, []), 0)  # clears it
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], 0)

        # A plain sampler over a dataset without .samples, with paths given as a list.
        sampler = dsfs_torch.PlanSampler(range(len(self.plan_paths)), mount=self.mnt,
                                         paths=self.plan_paths)
        order = list(sampler)
        self.assertEqual(sorted(order), list(range(len(self.plan_paths))))
        self.assertEqual(prefetch_stats(self.mnt)["plan"]["entries"], len(self.plan_paths))

        with self.assertRaisesRegex(ValueError, "not under the dsfs mount"):
            dsfs_torch.write_plan(self.mnt, ["/etc/passwd"])
        with self.assertRaisesRegex(dsfs_torch.NotADsfsMount, "not a dsfs mount"):
            dsfs_torch.write_plan(self.tmp, self.plan_paths)
        with self.assertRaisesRegex(dsfs_torch.NotADsfsMount, "not inside a dsfs mount"):
            dsfs_torch.PlanSampler(datasets.ImageFolder(self.src))
        with self.assertRaisesRegex(TypeError, "pass paths="):
            dsfs_torch.PlanSampler(range(3), mount=self.mnt)


class PlanSamplerWithoutMountTest(unittest.TestCase):
    """PlanSampler's own logic against a directory laid out like a mount's .dsfs (a plain file
    for the plan, so what was written can be read back)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="dsfs-plan-")
        self.mnt = os.path.join(self.tmp.name, "mnt")
        os.makedirs(os.path.join(self.mnt, ".dsfs"))
        for name in ("stats.json", "plan"):
            with open(os.path.join(self.mnt, ".dsfs", name), "w") as f:
                f.write("{}" if name == "stats.json" else "")
        for label in ("a", "b"):
            os.makedirs(os.path.join(self.mnt, "ds", label))
            for i in range(3):
                with open(os.path.join(self.mnt, "ds", label, f"{i}.jpg"), "wb") as f:
                    f.write(bytes([i]))

    def tearDown(self):
        self.tmp.cleanup()

    def plan(self):
        with open(os.path.join(self.mnt, ".dsfs", "plan")) as f:
            return f.read().splitlines()

    def test_wraps_batch_and_distributed_samplers(self):
        folder = datasets.ImageFolder(os.path.join(self.mnt, "ds"), loader=file_crc)
        batches = torch.utils.data.BatchSampler(
            torch.utils.data.SequentialSampler(folder), batch_size=4, drop_last=False)
        sampler = dsfs_torch.PlanSampler(batches, mount=self.mnt, paths=lambda i: folder.samples[i][0])
        self.assertEqual(list(sampler), [[0, 1, 2, 3], [4, 5]])
        self.assertEqual(self.plan(), ["ds/a/0.jpg", "ds/a/1.jpg", "ds/a/2.jpg", "ds/b/0.jpg",
                                       "ds/b/1.jpg", "ds/b/2.jpg"])

        shard = torch.utils.data.distributed.DistributedSampler(folder, num_replicas=2, rank=1,
                                                                seed=3)
        sampler = dsfs_torch.PlanSampler(shard)  # the mount is found from folder.root
        self.assertEqual(sampler.mount, self.mnt)
        sampler.set_epoch(1)
        self.assertEqual(shard.epoch, 1)
        order = list(sampler)
        self.assertEqual(len(order), 3)
        self.assertEqual(self.plan(), [os.path.relpath(folder.samples[i][0], self.mnt)
                                       for i in order])

    def test_append_extends_and_relative_dataset_roots_work(self):
        cwd = os.getcwd()
        os.chdir(self.tmp.name)
        try:
            folder = datasets.ImageFolder(os.path.join("mnt", "ds"))  # paths relative to cwd
            sampler = dsfs_torch.PlanSampler(torch.utils.data.SequentialSampler(folder),
                                             append=True)
            list(sampler)
            list(sampler)
        finally:
            os.chdir(cwd)
        self.assertEqual(len(self.plan()), 12)
        self.assertEqual(self.plan()[:6], self.plan()[6:])
        self.assertEqual(self.plan()[0], "ds/a/0.jpg")


if __name__ == "__main__":
    unittest.main()
