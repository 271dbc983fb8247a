"""Many ranks, one mount: two processes standing for two DDP ranks on one node, each with a
DistributedSampler (shuffled, num_replicas=2) wrapped in dsfs_torch.PlanSampler over a
torchvision ImageFolder of the mounted dataset, and a two-worker DataLoader, read their epochs at
the same time through one mount `dsfs proxy --rtt 20ms` away from Redis. Each rank writes its
own plan to MOUNT/.dsfs/plan (O_TRUNC, at offset 0): the mount keeps one plan per writer, so
neither replaces the other's. Checked from stats.json: the engine saw two plan writers whose
plans together name the whole dataset, and the planned reads were served from objects fetched
ahead (ready or joined); and each rank read exactly its DistributedSampler half, the bytes the
source has. And the per-writer protocol through FUSE, process by process: O_TRUNC rewrites,
O_APPEND at another writer's size, and a new writer going on with the plan of one that exited.
Correctness only: counters, never timings.

Run as a script with `rank MOUNT RANK EPOCHS WORKDIR`, this module is one rank."""
import json
import os
import subprocess
import sys
import zlib

from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets

from harness import DsfsTestCase, Proxy, mount_stats, run, synth_data, wait_for

dsfs_torch_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                              "python")
sys.path.insert(0, dsfs_torch_dir)
import dsfs_torch  # noqa: E402

RANKS = 2
EPOCHS = 2
CLASSES = 4
PER_CLASS = 50  # 200 files: each rank's half is whole (a DistributedSampler pads none)
DATASET = "pr"
# Generous: a rank waits for the parent, the parent for the ranks (each a Python with torch).
DEADLINE_S = 300


def _flag(workdir, what, rank, epoch):
    return os.path.join(workdir, f"{what}-{rank}-{epoch}")


def _touch(path, text=""):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)  # seen whole or not at all


# The file whose existence lets a rank's loader workers read (set before they are forked): a
# DataLoader's workers start loading as soon as the loader is iterated, which writes the plan.
_gate = None


def read_and_crc(path):
    """An ImageFolder loader: the file's path and CRC-32 (what was read, cheaply), once the
    parent opened the gate."""
    wait_for(lambda: os.path.exists(_gate), DEADLINE_S, f"the gate {_gate}")
    with open(path, "rb") as f:
        return path, zlib.crc32(f.read())


def rank_main(mount, rank, epochs, workdir):
    """One rank: per epoch, writes its plan (iter(loader)), says so, reads its half once the
    parent says go and reports the paths it read in order and their CRCs."""
    folder = datasets.ImageFolder(os.path.join(mount, DATASET), loader=read_and_crc)
    shard = DistributedSampler(folder, num_replicas=RANKS, rank=rank, shuffle=True, seed=7)
    sampler = dsfs_torch.PlanSampler(shard)
    loader = DataLoader(folder, batch_size=4, sampler=sampler, num_workers=2)
    global _gate
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        expected = [os.path.relpath(folder.samples[i][0], mount) for i in shard]
        _gate = _flag(workdir, "go", 0, epoch)  # no READ on the mount before the parent's go
        batches = iter(loader)  # the sampler draws and writes this rank's plan here
        _touch(_flag(workdir, "planned", rank, epoch))
        read = []
        for (paths, crcs), _ in batches:
            read += [(os.path.relpath(p, mount), c) for p, c in zip(paths, crcs.tolist())]
        _touch(_flag(workdir, "done", rank, epoch),
               json.dumps({"pid": os.getpid(), "expected": expected, "read": read}))


class PlanRanksTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        synth_data(src, "--classes", CLASSES, "--per-class", PER_CLASS, "--seed", "5")
        self.dsfs("ingest", src, "--dataset", DATASET, "--progress", "none")
        self.crcs = {}
        for d, _, names in os.walk(src):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    self.crcs[f"{DATASET}/{os.path.relpath(os.path.join(d, name), src)}"] = (
                        zlib.crc32(f.read()))
        self.dataset_bytes = sum(os.path.getsize(os.path.join(d, n))
                                 for d, _, names in os.walk(src) for n in names)
        self.proxy = Proxy(self.tmp, self.redis, "20ms")
        self.ranks = []

    def tearDown(self):
        for proc in self.ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        super().tearDown()
        self.proxy.stop()

    def stats(self):
        return mount_stats(self.mnt)

    def cache_filled_bytes(self):
        cache = self.stats()["cache"]
        return cache["bytes"] + cache["reserved_bytes"]

    def test_two_ranks_each_follow_their_own_plan_on_one_mount(self):
        self.mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(self.mnt)
        # A cache twice the dataset: both plans fit, whole, with room to spare.
        self.dsfs("mount", self.mnt, "--redis", self.proxy.url, "--prefetch", "plan",
                  "--cache-size", str(2 * self.dataset_bytes), redis=False)
        self.mounts.append(self.mnt)
        work = os.path.join(self.tmp, "ranks")
        os.makedirs(work)
        logs = [open(os.path.join(work, f"rank-{r}.log"), "w") for r in range(RANKS)]
        try:
            for r in range(RANKS):
                self.ranks.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "rank", self.mnt, str(r),
                     str(EPOCHS), work], stdout=logs[r], stderr=subprocess.STDOUT))
            results = [self.run_epoch(work, epoch) for epoch in range(EPOCHS)]
            for r, proc in enumerate(self.ranks):
                self.assertEqual(proc.wait(timeout=DEADLINE_S), 0, self.rank_log(work, r))
        finally:
            for log in logs:
                log.close()

        stats = self.stats()
        self.assertEqual(stats["prefetch"]["plan"]["unresolved"], 0)
        for epoch, (halves, reads) in enumerate(results):
            total = sum(reads.values())
            if epoch == 0:
                # Every file was READ once at least (later epochs may find the page cache).
                self.assertGreaterEqual(total, len(self.crcs), reads)
            if total:
                hit = (reads["ready"] + reads["joined"]) / total
                self.assertGreaterEqual(hit, 0.99, f"epoch {epoch}: {reads}")
            # Each rank read its DistributedSampler half, in its order, the source's bytes; the
            # halves are disjoint and together the whole dataset.
            for r, half in enumerate(halves):
                self.assertEqual([p for p, _ in half["read"]], half["expected"],
                                 f"rank {r}, epoch {epoch}")
                self.assertEqual(len(half["expected"]), len(self.crcs) // RANKS)
                for path, crc in half["read"]:
                    self.assertEqual(crc, self.crcs[path], path)
            sets = [set(h["expected"]) for h in halves]
            self.assertFalse(sets[0] & sets[1], f"epoch {epoch}: the halves overlap")
            self.assertEqual(sets[0] | sets[1], set(self.crcs), f"epoch {epoch}")
        self.assertNotEqual(results[0][0][0]["expected"], results[1][0][0]["expected"],
                            "a shuffling DistributedSampler reshuffles each epoch")

    def test_each_writer_process_replaces_appends_and_is_forgotten_on_its_own(self):
        """The plan file's per-writer protocol through FUSE: the writer is the process, an
        O_APPEND write extends the writer's own plan wherever the kernel puts it (at the size
        another writer gave the file), and a new writer goes on with the plan of the one that
        exited."""
        self.mnt = self.mount()
        paths = sorted(self.crcs)

        def write_in_child(lines, append):
            code = ("import sys, dsfs_torch; "
                    "dsfs_torch.write_plan(sys.argv[1], sys.argv[3:], append=sys.argv[2] == '1')")
            run([sys.executable, "-c", code, self.mnt, "1" if append else "0", *lines],
                env=dict(os.environ, PYTHONPATH=dsfs_torch_dir))

        def plan():
            p = self.stats()["prefetch"]["plan"]
            return p["entries"], p.get("writers")

        dsfs_torch.write_plan(self.mnt, paths[:10])  # this process: O_TRUNC, at 0
        self.assertEqual(plan(), (10, 1))
        write_in_child(paths[10:15], append=True)  # O_APPEND: at this process's size
        self.assertEqual(plan(), (15, 2))
        dsfs_torch.write_plan(self.mnt, paths[:3])  # replaces this process's plan only
        self.assertEqual(plan(), (8, 2))
        # A new writer goes on with the plan of the one that exited: replacing it, from 0.
        write_in_child(paths[20:24], append=False)
        self.assertEqual(plan(), (7, 2))
        # And one that appends after it extends it (`dsfs plan`, then `dsfs plan --append`).
        write_in_child(paths[30:32], append=True)
        self.assertEqual(plan(), (9, 2))

    def run_epoch(self, work, epoch):
        """Waits for both ranks' plans, checks the engine holds both, lets the ranks read once
        the plans' objects are cached, and returns what the ranks report and how this epoch's
        READs found their bytes."""
        for r in range(RANKS):
            self.wait_for_rank(work, "planned", r, epoch)
        plan = self.stats()["prefetch"]["plan"]
        # Two writers, each with its own half: had one rank's plan replaced the other's, the
        # engine would hold one writer and half the entries.
        self.assertEqual(plan.get("writers"), RANKS, f"epoch {epoch}: {plan}")
        self.assertEqual(plan["entries"], len(self.crcs), f"epoch {epoch}: {plan}")
        self.assertEqual(plan["unresolved"], 0, f"epoch {epoch}: {plan}")
        if epoch == 0:
            # What makes the hit rate hold on a slow machine: the ranks start once the plans'
            # objects are cached, as a loader's first batches would find them. Both plans
            # together name the whole dataset; one plan alone could not fill this much.
            wait_for(lambda: self.cache_filled_bytes() >= 0.9 * self.dataset_bytes, DEADLINE_S,
                     "both plans' objects to be fetched ahead")
        before = self.stats()["prefetch"]["reads"]
        _touch(_flag(work, "go", 0, epoch))
        halves = []
        for r in range(RANKS):
            self.wait_for_rank(work, "done", r, epoch)
            with open(_flag(work, "done", r, epoch)) as f:
                halves.append(json.load(f))
        after = self.stats()["prefetch"]["reads"]
        self.assertNotEqual(halves[0]["pid"], halves[1]["pid"])
        return halves, {k: after[k] - before[k] for k in ("ready", "joined", "miss")}

    def wait_for_rank(self, work, what, rank, epoch):
        proc = self.ranks[rank]

        def arrived():
            if proc.poll() is not None and not os.path.exists(_flag(work, what, rank, epoch)):
                raise AssertionError(f"rank {rank} exited ({proc.returncode}) before '{what}' of "
                                     f"epoch {epoch}:\n{self.rank_log(work, rank)}")
            return os.path.exists(_flag(work, what, rank, epoch))

        wait_for(arrived, DEADLINE_S, f"rank {rank}: '{what}' of epoch {epoch}")

    @staticmethod
    def rank_log(work, rank):
        with open(os.path.join(work, f"rank-{rank}.log"), errors="replace") as f:
            return f.read()[-4000:]


if __name__ == "__main__":
    if sys.argv[1:2] == ["rank"]:
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        import unittest

        unittest.main()
