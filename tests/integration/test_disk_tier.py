"""The local-disk tier (issue 13) through a real `dsfs mount --disk-cache`: with a RAM cache far
smaller than the dataset, shuffled epochs equal the source byte for byte and from the second one
Redis serves (almost) no GETs; a remount finds the tier warm; damaged tier files (a flipped byte,
a truncated and a deleted file) are read from Redis, correctly, and counted; a re-ingested
dataset is served its new bytes; a second mount on the same directory is refused; `dsfs cache`
shows a tier (while a mount uses it too) and clears it only when none does."""
import glob
import json
import os
import random
import shutil
import signal
import unittest

from harness import DsfsTestCase, is_mounted, run, wait_for
from test_read_path import drop_page_cache

FILES = 60


def evict_from_page_cache(paths):
    """Writes the files back and drops them from the page cache (where the filesystem lets it),
    so that the next read goes to the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def takes_o_direct(directory):
    """Whether the filesystem under `directory` lets a file be opened with O_DIRECT."""
    probe = os.path.join(directory, "o-direct-probe")
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


class DiskTierTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.tmp, "src")
        self.files = self.write_source(seed=1)
        self.dsfs("ingest", self.src, "--dataset", "dt", "--progress", "none")
        self.tier = os.path.join(self.tmp, "tier")

    def write_source(self, seed):
        rng = random.Random(seed)
        os.makedirs(os.path.join(self.src, "c"), exist_ok=True)
        files = {}
        for i in range(FILES):
            data = rng.randbytes(40_000 + rng.randrange(120_000))
            with open(os.path.join(self.src, "c", f"{i}.bin"), "wb") as f:
                f.write(data)
            files[f"c/{i}.bin"] = data
        return files

    def mount_with_tier(self, *extra, name="mnt"):
        # A RAM cache of about a sixth of the dataset; no prefetching, so every RAM miss is a
        # demand read (the planned test below covers the engine's fetches).
        return self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", self.tier,
                          "--disk-cache-size", "64MiB", *extra, name=name)

    def redis_gets(self):
        info = self.redis.cli("INFO", "commandstats")
        for line in info.splitlines():
            if line.startswith("cmdstat_get:"):
                return int(line.split("calls=")[1].split(",")[0])
        return 0

    def epoch(self, mnt, seed):
        """Reads every file once in a shuffled order, from the daemon (not the page cache)."""
        names = sorted(self.files)
        random.Random(seed).shuffle(names)
        self.read_checked(mnt, names)

    def read_checked(self, mnt, names):
        """Reads the files in this order from the daemon (not the page cache), checking each."""
        for rel in names:
            path = os.path.join(mnt, "dt", rel)
            drop_page_cache(path)
            with open(path, "rb") as f:
                self.assertTrue(f.read() == self.files[rel], f"{rel} differs from the source")

    def write_plan(self, mnt, order):
        with open(os.path.join(mnt, ".dsfs", "plan"), "w") as f:
            f.write("".join(f"dt/{rel}\n" for rel in order))

    def planned_epoch(self, mnt, seed):
        """Writes a shuffled order (seed) to MOUNT/.dsfs/plan, then reads every file in it, from
        the daemon (not the page cache), checking its bytes."""
        order = sorted(self.files)
        random.Random(seed).shuffle(order)
        self.write_plan(mnt, order)
        self.read_checked(mnt, order)

    def fill_tier(self):
        """One epoch through a mount with the tier, every object written, then unmounted (the
        index saved)."""
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=1)
        self.wait_written(mnt, FILES)
        self.umount(mnt)

    def wait_drained(self, mnt):
        wait_for(lambda: self.stats(mnt)["disk_tier"]["queued_bytes"] == 0, 30,
                 "the write-behind queue to drain")

    def wait_written(self, mnt, count):
        wait_for(lambda: self.stats(mnt)["disk_tier"]["writes"] >= count
                 and self.stats(mnt)["disk_tier"]["queued_bytes"] == 0, 30,
                 f"{count} objects written to the disk tier")

    def test_shuffled_epochs_are_served_from_disk_after_the_first(self):
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=1)
        self.wait_written(mnt, FILES)
        gets_before = self.redis_gets()
        for seed in (2, 3):
            self.epoch(mnt, seed)
        stats = self.stats(mnt)
        tier = stats["disk_tier"]
        # Redis's own count (the catalogue and the watcher use no GET).
        later_gets = self.redis_gets() - gets_before
        self.assertLessEqual(later_gets, 2, f"Redis served {later_gets} GETs after epoch 1")
        self.assertEqual(stats["redis_ops"]["gets"], FILES)  # epoch 1's misses, nothing more
        self.assertGreater(tier["hits"], FILES)  # two epochs less what RAM still held
        self.assertLessEqual(tier["bytes_used"], 64 << 20)
        self.assertEqual(tier["checksum_failures"], 0)
        self.assertEqual(tier["writes_dropped"], 0)

    def test_a_remount_starts_warm_and_damaged_files_come_from_redis(self):
        self.fill_tier()

        objects = sorted(glob.glob(os.path.join(self.tier, "objects", "*", "*")))
        self.assertEqual(len(objects), FILES)
        # The clean unmount saved the index, which the next mount loads instead of listing.
        self.assertTrue(os.path.exists(os.path.join(self.tier, "index")))
        with open(objects[0], "r+b") as f:  # a flipped byte in the payload
            f.seek(-10, os.SEEK_END)
            byte = f.read(1)
            f.seek(-10, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0x40]))
        os.truncate(objects[1], 1000)
        os.unlink(objects[2])

        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=7)
        stats = self.stats(mnt)
        tier = stats["disk_tier"]
        self.assertTrue(tier["index_loaded"])
        self.assertFalse(os.path.exists(os.path.join(self.tier, "index")))  # used once
        self.assertEqual(tier["checksum_failures"], 2)
        self.assertEqual(tier["read_errors"], 1)  # the deleted file, named by the saved index
        self.assertEqual(tier["hits"], FILES - 3)
        self.assertEqual(stats["redis_ops"]["gets"], 3)  # only the damaged ones
        self.assertEqual(stats["errors"]["integrity"], 0)
        # And written again: the next mount reads every file from disk, each either through the
        # page cache (which still holds what was written lately) or around it.
        self.wait_written(mnt, 3)
        self.umount(mnt)
        evict_from_page_cache(glob.glob(os.path.join(self.tier, "objects", "*", "*")))
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=8)
        stats = self.stats(mnt)
        self.assertEqual(stats["redis_ops"]["gets"], 0)
        tier = stats["disk_tier"]
        self.assertEqual(tier["hits"], FILES)
        self.assertEqual(tier["page_cache_reads"] + tier["direct_reads"], FILES)
        self.assertEqual(tier["direct_io"], takes_o_direct(self.tier))
        if not tier["direct_io"]:
            self.assertEqual(tier["direct_reads"], 0)

    def test_a_remount_stages_the_tier_into_memory_before_the_first_read(self):
        """With prefetching on, a mount whose tier holds the dataset fills its memory cache from
        the tier before any read, as a steady epoch begins with the last one's files in memory:
        from disk only (no GET), within the cache's bound; the first epoch then reads them from
        memory, and every file is right."""
        self.fill_tier()
        mnt = self.mount("--cache-size", "2MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "64MiB")
        gets_before = self.redis_gets()  # after the mount's own (the catalogue's)

        def staged():
            s = self.stats(mnt)
            staging = s["prefetch"]["disk_staging"]
            return (s["cache"]["entries"] > 0 and staging["objects"] == 0
                    and s["prefetch"]["disk_reads"] == staging.get("before_first_read")), s
        wait_for(lambda: staged()[0], 30, "the cache filled from the tier before any read")
        stats = staged()[1]
        early = stats["prefetch"]["disk_staging"]["before_first_read"]
        self.assertGreaterEqual(early, 5)  # about 18 files of 100 KB fill 90% of 2 MiB
        self.assertEqual(stats["disk_tier"]["hits"], early)
        self.assertEqual(stats["cache"]["entries"], early)
        self.assertLessEqual(stats["cache"]["bytes"], 2 << 20)
        self.assertEqual(stats["prefetch"]["gets"] + stats["redis_ops"]["gets"], 0)
        self.assertEqual(self.redis_gets(), gets_before)
        self.assertEqual(stats["files_read"], 0)
        self.epoch(mnt, seed=2)
        stats = self.stats(mnt)
        self.assertGreater(stats["prefetch"]["reads"]["ready"], 0)
        self.assertEqual(stats["prefetch"]["disk_staging"]["before_first_read"], early)
        self.assertEqual(self.redis_gets(), gets_before)  # every file from the tier
        self.assertEqual(stats["disk_tier"]["checksum_failures"], 0)

    def test_a_tier_smaller_than_the_dataset_starts_warm_too(self):
        """A tier that holds about three quarters of the dataset (it evicted as it was written)
        still fills the memory cache before the first read, from disk only; the epoch after
        reads every file right, those the tier lacks from Redis."""
        mnt = self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", self.tier,
                         "--disk-cache-size", "4608KiB")
        self.epoch(mnt, seed=1)
        self.wait_drained(mnt)
        tier = self.stats(mnt)["disk_tier"]
        self.assertGreater(tier["evictions"], 0)
        self.assertLess(tier["entries"], FILES * 0.9)  # below what a warm start needed before
        self.assertGreaterEqual(tier["entries"], FILES * 0.5)
        self.umount(mnt)
        mnt = self.mount("--cache-size", "2MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "4608KiB")
        gets_before = self.redis_gets()
        wait_for(lambda: self.stats(mnt)["prefetch"]["disk_staging"].get("before_first_read", 0)
                 >= 5, 30, "the cache filled from the tier before any read")
        stats = self.stats(mnt)
        self.assertEqual(stats["prefetch"]["gets"] + stats["redis_ops"]["gets"], 0)
        self.assertEqual(self.redis_gets(), gets_before)
        self.assertEqual(stats["files_read"], 0)
        self.epoch(mnt, seed=2)
        stats = self.stats(mnt)
        self.assertGreater(stats["prefetch"]["reads"]["ready"], 0)
        self.assertEqual(stats["disk_tier"]["checksum_failures"], 0)

    def test_a_plan_written_before_the_first_read_ends_the_warm_start(self):
        """The warm start stages only what the tier holds; a plan written before the first read
        ends it, and the engine fetches the planned files the tier lacks from Redis, ahead."""
        self.fill_tier()
        for path in sorted(glob.glob(os.path.join(self.tier, "objects", "*", "*")))[:3]:
            os.unlink(path)
        os.unlink(os.path.join(self.tier, "index"))  # listed again: the three are not there
        mnt = self.mount("--cache-size", "64MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "64MiB")

        def staging(key):
            return self.stats(mnt)["prefetch"]["disk_staging"][key]
        wait_for(lambda: staging("before_first_read") == FILES - 3 and staging("objects") == 0,
                 30, "the files the tier holds staged before any read")
        self.assertEqual(self.stats(mnt)["prefetch"]["gets"], 0)
        order = sorted(self.files)
        self.write_plan(mnt, order)
        wait_for(lambda: self.stats(mnt)["prefetch"]["gets"] == 3
                 and self.stats(mnt)["prefetch"]["inflight"]["objects"] == 0, 30,
                 "the three planned files the tier lacks fetched from Redis")
        self.read_checked(mnt, order)
        stats = self.stats(mnt)
        # Every file was in memory when read (or, had a reply been late, joined its fetch): no
        # reader fetched one itself.
        self.assertEqual(stats["redis_ops"]["gets"], 0)
        reads = stats["prefetch"]["reads"]
        self.assertEqual(reads["ready"] + reads["joined"], FILES, reads)

    def test_disk_cache_page_cache_reads_every_file_through_the_page_cache(self):
        self.fill_tier()
        evict_from_page_cache(glob.glob(os.path.join(self.tier, "objects", "*", "*")))
        mnt = self.mount_with_tier("--disk-cache-page-cache")
        self.epoch(mnt, seed=2)
        stats = self.stats(mnt)
        tier = stats["disk_tier"]
        self.assertFalse(tier["direct_io"])
        self.assertEqual(tier["hits"], FILES)
        self.assertEqual(tier["page_cache_reads"], FILES)
        self.assertEqual(tier["direct_reads"], 0)
        self.assertEqual(stats["redis_ops"]["gets"], 0)
        self.assertEqual(stats["disk_tier"]["hits"], FILES)

    def test_a_reingested_dataset_is_served_its_new_bytes(self):
        self.fill_tier()
        self.files = self.write_source(seed=2)
        self.dsfs("ingest", self.src, "--dataset", "dt", "--progress", "none")
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=3)
        tier = self.stats(mnt)["disk_tier"]
        self.assertEqual(tier["hits"], 0)
        self.assertEqual(tier["checksum_failures"], 0)

    def test_a_dataset_removed_and_made_again_is_served_its_new_bytes(self):
        # Files of the same names and sizes, other bytes: nothing but the generation tells the
        # two datasets apart. rm once deleted the generation counter, the new dataset was
        # generation 1 again, and the tier served the removed dataset's bytes for it.
        self.fill_tier()
        before = json.loads(self.dsfs("info", "dt", "--json").stdout)["generation"]
        self.dsfs("rm", "dt")
        for rel, data in list(self.files.items()):
            self.files[rel] = bytes(b ^ 0x5A for b in data)
            with open(os.path.join(self.src, rel), "wb") as f:
                f.write(self.files[rel])
        self.dsfs("ingest", self.src, "--dataset", "dt", "--progress", "none")
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=3)
        self.assertEqual(self.stats(mnt)["disk_tier"]["hits"], 0)
        self.assertGreater(json.loads(self.dsfs("info", "dt", "--json").stdout)["generation"],
                           before)

    def test_a_tier_filled_from_another_namespace_serves_none_of_its_bytes(self):
        # The same name and generation in two namespaces, the same sizes, other bytes: the
        # files record which ingest wrote them, and the other's are dropped, not served.
        # Generation numbers are the server's time in microseconds, so a counter set ahead of
        # it in both namespaces makes them equal.
        ahead = "8999999999999999"
        self.redis.cli("SET", "dsfs:{dt}:nextgen", ahead)
        self.dsfs("ingest", self.src, "--dataset", "dt", "--progress", "none")
        self.fill_tier()
        for rel, data in list(self.files.items()):
            self.files[rel] = bytes(b ^ 0xA5 for b in data)
            with open(os.path.join(self.src, rel), "wb") as f:
                f.write(self.files[rel])
        self.redis.cli("SET", "other:{dt}:nextgen", ahead)
        self.dsfs("ingest", self.src, "--dataset", "dt", "--namespace", "other", "--progress",
                  "none")
        self.assertEqual(json.loads(self.dsfs("info", "dt", "--json").stdout)["generation"],
                         json.loads(self.dsfs("info", "dt", "--json", "--namespace",
                                              "other").stdout)["generation"])
        mnt = self.mount_with_tier("--namespace", "other")
        self.epoch(mnt, seed=4)
        tier = self.stats(mnt)["disk_tier"]
        self.assertEqual(tier["hits"], 0)
        self.assertGreater(tier["stale_drops"], 0)
        self.assertEqual(tier["checksum_failures"], 0)

    def test_a_second_mount_on_the_same_directory_is_refused(self):
        self.mount_with_tier()
        other = os.path.join(self.tmp, "other")
        os.makedirs(other)
        res = self.dsfs("mount", other, "--disk-cache", self.tier, "--disk-cache-size", "64MiB",
                        check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("in use by another dsfs mount", res.stderr)

    def test_sizes_and_places_that_cannot_work_are_refused(self):
        # Each was accepted (found by an audit): a size of 0 said the size was missing, a
        # size without a unit cached nothing, and a tier inside the mountpoint failed every
        # write through the read-only mount.
        mnt = os.path.join(self.tmp, "refused")
        os.makedirs(mnt)
        for size, what in (("0", "above 0"), ("4096", "at least 1MiB")):
            res = self.dsfs("mount", mnt, "--disk-cache", self.tier, "--disk-cache-size", size,
                            check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn(what, res.stderr)
        res = self.dsfs("mount", mnt, "--disk-cache", os.path.join(mnt, "tier"),
                        "--disk-cache-size", "64MiB", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("inside the mountpoint", res.stderr)
        self.assertFalse(is_mounted(mnt))

    def test_a_tier_smaller_than_the_dataset_serves_its_share_when_epochs_repeat_one_order(self):
        """Epochs in one order through a tier of about a third of the dataset: each epoch reads
        the tier's share from disk. Before, least-recently-used eviction evicted each file just
        before its next read (1-4 hits an epoch in an audit with 1,500 files)."""
        mnt = self.mount("--cache-size", "1MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "2MiB")
        order = sorted(self.files)
        hits = []
        for _ in range(4):
            self.read_checked(mnt, order)
            self.wait_drained(mnt)
            hits.append(self.stats(mnt)["disk_tier"]["hits"])
        tier = self.stats(mnt)["disk_tier"]
        self.assertGreaterEqual(tier["entries"], 10)
        self.assertLessEqual(tier["bytes_used"], 2 << 20)
        # The last two epochs: about the tier's entries each, less what the RAM cache held.
        self.assertGreaterEqual(hits[3] - hits[1], tier["entries"], f"hits after each epoch: {hits}")
        self.assertGreater(tier["writes_declined"], 0)
        stats = self.stats(mnt)
        self.assertEqual(stats["errors"]["integrity"] + stats["errors"]["internal"], 0)

    def test_the_tier_stays_within_its_size(self):
        mnt = self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", self.tier,
                         "--disk-cache-size", "2MiB")
        self.epoch(mnt, seed=1)
        self.wait_drained(mnt)
        tier = self.stats(mnt)["disk_tier"]
        self.assertLessEqual(tier["bytes_used"], 2 << 20)
        self.assertGreater(tier["evictions"], 0)
        # Writes into the full tier took over the files they evicted.
        self.assertGreater(tier["files_reused"], 0)
        on_disk = sum(os.path.getsize(p)
                      for p in glob.glob(os.path.join(self.tier, "objects", "*", "*")))
        self.assertLessEqual(on_disk, 2 << 20)
        self.epoch(mnt, seed=2)  # still right, from files written into others' places too
        tier = self.stats(mnt)["disk_tier"]
        self.assertGreater(tier["hits"], 0)
        self.assertEqual(tier["checksum_failures"], 0)

    def test_prefetching_on_still_serves_the_right_bytes(self):
        # The engine's prefetches race the demand path's tier reads and writes.
        mnt = self.mount("--cache-size", "1MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "64MiB")
        for seed in (1, 2, 3):
            self.epoch(mnt, seed)
        self.assertEqual(self.stats(mnt)["disk_tier"]["checksum_failures"], 0)

    def test_planned_epochs_are_prefetched_from_disk_after_the_first(self):
        """With prefetching on (the default) and each epoch's order in .dsfs/plan, the engine's
        fetches of epoch 1 are written to the tier too, and from epoch 2 its disk readers stage
        the coming files from disk into RAM instead of asking Redis."""
        mnt = self.mount("--cache-size", "1MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "64MiB", "--disk-cache-readers", "3")
        self.planned_epoch(mnt, 1)
        self.wait_written(mnt, FILES)
        gets_before = self.redis_gets()
        staged_before = self.stats(mnt)["prefetch"]["disk_reads"]
        for seed in (2, 3):
            self.planned_epoch(mnt, seed)
        stats = self.stats(mnt)
        later_gets = self.redis_gets() - gets_before
        self.assertLessEqual(later_gets, 2, f"Redis served {later_gets} GETs after epoch 1")
        # The engine staged files ahead from disk (how many depends on how often this one fast
        # local reader overtook it: 42 and 43 of 120 measured; the rest it read there itself).
        staged = stats["prefetch"]["disk_reads"] - staged_before
        self.assertGreater(staged, 0, stats["prefetch"])
        self.assertEqual(stats["disk_tier"]["checksum_failures"], 0)
        staging = stats["prefetch"]["disk_staging"]
        self.assertEqual(staging["threads"], 3)
        self.assertGreater(staging["peak"], 0)
        self.assertLessEqual(staging["peak"], 6)  # twice the readers: queued or being read
        wait_for(lambda: self.stats(mnt)["prefetch"]["disk_staging"]["objects"] == 0, 30,
                 "the disk readers to finish")
        # `dsfs stats` shows the stagers on the tier's line (idle now: the peak no longer moves).
        peak = self.stats(mnt)["prefetch"]["disk_staging"]["peak"]
        summary = self.dsfs("stats", mnt, redis=False).stdout
        tier_line = next(line for line in summary.splitlines() if line.startswith("disk tier"))
        # (Nothing staged before the first read: the tier was empty at the mount.)
        self.assertRegex(tier_line, rf"staging 0 \(peak {peak}, 3 readers, 0 before the first read, "
                                    r"[0-9,]+ passed on\)")

    def test_planned_files_damaged_on_disk_come_right_from_redis(self):
        """Every tier file damaged after epoch 1 (a byte flipped: the index still lists them):
        in a planned epoch the disk readers and the readers' own misses both find them bad, and
        each read is still right, from Redis; nothing is given up."""
        mnt = self.mount("--cache-size", "1MiB", "--disk-cache", self.tier, "--disk-cache-size",
                         "64MiB", "--disk-cache-readers", "4")
        self.planned_epoch(mnt, 1)
        self.wait_written(mnt, FILES)
        objects = glob.glob(os.path.join(self.tier, "objects", "*", "*"))
        self.assertEqual(len(objects), FILES)
        for path in objects:
            with open(path, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                byte = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([byte[0] ^ 0x01]))
        before = self.stats(mnt)
        self.planned_epoch(mnt, 2)
        stats = self.stats(mnt)
        # Each found bad where first read from disk (not those still in the memory cache).
        self.assertGreater(stats["disk_tier"]["checksum_failures"], FILES // 2)
        self.assertEqual(stats["disk_tier"]["hits"], before["disk_tier"]["hits"])
        self.assertEqual(stats["prefetch"]["disk_reads"], before["prefetch"]["disk_reads"])
        self.assertEqual(stats["prefetch"]["failures"], 0)
        self.assertEqual(stats["errors"]["integrity"] + stats["errors"]["internal"], 0)
        wait_for(lambda: self.stats(mnt)["prefetch"]["disk_staging"]["objects"] == 0, 30,
                 "the disk readers to finish")

    def test_disk_cache_readers_are_checked(self):
        for args, message in ((["--disk-cache-readers", "4"], "--disk-cache"),
                              (["--disk-cache-page-cache"], "--disk-cache"),
                              (["--disk-cache", self.tier, "--disk-cache-size", "64MiB",
                                "--disk-cache-readers", "0"], "--disk-cache-readers")):
            res = self.dsfs("mount", os.path.join(self.tmp, "never"), *args, check=False)
            self.assertNotEqual(res.returncode, 0, args)
            self.assertIn(message, res.stderr, args)
        self.assertFalse(os.path.exists(os.path.join(self.tier, "objects")))

    @unittest.skipUnless(os.geteuid() == 0, "mounting a tmpfs needs root")
    def test_a_filesystem_with_less_room_than_asked_bounds_the_tier_and_reads_go_on(self):
        small = os.path.join(self.tmp, "small")
        os.makedirs(small)
        # Twice the memory cache: what the tier holds beyond it is read from disk.
        run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", small])
        try:
            tier = os.path.join(small, "tier")
            # Less room than asked for: the tier keeps to the room there is, and evicts within
            # it (before, it counted on 64 MiB and every write past 1 MiB failed with ENOSPC).
            mnt = self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", tier,
                             "--disk-cache-size", "64MiB")
            self.assertLess(self.stats(mnt)["disk_tier"]["capacity_bytes"], 2 << 20)
            order = sorted(self.files)
            random.Random(1).shuffle(order)
            self.read_checked(mnt, order)
            self.wait_drained(mnt)
            # The files read last are the ones the tier still holds: read them first.
            self.read_checked(mnt, order[::-1])
            self.wait_drained(mnt)
            stats = self.stats(mnt)
            self.assertGreater(stats["disk_tier"]["hits"], 0)  # what fitted is used
            self.assertGreater(stats["disk_tier"]["evictions"], 0)
            self.assertLess(stats["disk_tier"]["write_errors"], 8)
            self.assertEqual(stats["errors"]["integrity"] + stats["errors"]["internal"], 0)
            self.umount(mnt)

            # Room taken by other files after the mount: the first writes that fail with ENOSPC
            # lower the tier's bound to what it holds, and later writes evict instead of failing.
            run(["rm", "-rf", tier])
            mnt = self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", tier,
                             "--disk-cache-size", "1800KiB", name="mnt2")
            self.assertEqual(self.stats(mnt)["disk_tier"]["capacity_bytes"], 1800 << 10)
            with open(os.path.join(small, "filler"), "wb") as f:
                f.write(b"\0" * (1200 << 10))
            self.epoch(mnt, seed=3)
            self.wait_drained(mnt)
            first = self.stats(mnt)["disk_tier"]
            self.assertLess(first["capacity_bytes"], 1800 << 10)
            self.assertGreater(first["write_errors"], 0)
            self.epoch(mnt, seed=4)
            self.wait_drained(mnt)
            second = self.stats(mnt)["disk_tier"]
            self.assertGreater(second["evictions"], first["evictions"])
            self.assertLess(second["write_errors"] - first["write_errors"], 8)
            self.umount(mnt)
        finally:
            run(["umount", small], check=False)
            if os.path.ismount(small):
                run(["umount", "-l", small], check=False)

    def test_a_daemon_killed_during_write_behind_leaves_no_wrong_bytes(self):
        mnt = self.mount("--cache-size", "1MiB", "--prefetch", "off", "--disk-cache", self.tier,
                         "--disk-cache-size", "3MiB")
        self.epoch(mnt, seed=1)
        # Killed at once: writes may still be queued or half done.
        pid = int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 30, "the daemon to exit")
        # What a write cut short leaves (whether or not the kill caught one): a temp file.
        objects = glob.glob(os.path.join(self.tier, "objects", "*", "*"))
        self.assertTrue(objects)
        shutil.copy(objects[0], objects[0] + ".tmp")

        mnt = self.mount_with_tier(name="again")  # the lock died with the daemon
        tier = self.stats(mnt)["disk_tier"]
        self.assertFalse(tier["index_loaded"])  # a killed daemon saves none: the files are listed
        self.assertGreaterEqual(tier["stale_temp_files"], 1)
        self.assertEqual(glob.glob(os.path.join(self.tier, "objects", "*", "*.tmp")), [])
        self.assertLessEqual(tier["bytes_used"], 3 << 20)
        self.epoch(mnt, seed=2)
        self.epoch(mnt, seed=3)
        tier = self.stats(mnt)["disk_tier"]
        self.assertGreater(tier["hits"], 0)
        self.assertEqual(tier["checksum_failures"], 0)

    def test_dsfs_cache_shows_a_tier_and_clears_it_only_when_no_mount_uses_it(self):
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=1)
        self.wait_written(mnt, FILES)
        shown = json.loads(self.dsfs("cache", "show", self.tier, "--json", redis=False).stdout)
        pid = run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0]
        self.assertEqual(shown["in_use_by_pid"], pid)
        self.assertEqual(shown["objects"], FILES)
        self.assertEqual(shown["bytes"], self.stats(mnt)["disk_tier"]["bytes_used"])
        self.assertEqual([(g["dataset"], g["generation"], g["objects"])
                          for g in shown["generations"]],
                         [("dt", json.loads(self.dsfs("info", "dt", "--json").stdout)["generation"],
                           FILES)])
        text = self.dsfs("cache", "show", self.tier, redis=False).stdout
        self.assertIn(f"in use by a dsfs mount (pid {pid})", text)
        # Refused while the mount uses it: nothing removed, reads still from the tier.
        res = self.dsfs("cache", "clear", self.tier, redis=False, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("unmount it first", res.stderr)
        self.assertEqual(len(glob.glob(os.path.join(self.tier, "objects", "*", "*"))), FILES)
        self.umount(mnt)
        # A file that is not the tier's is left alone.
        stranger = os.path.join(self.tier, "objects", "00", "notes.txt")
        os.makedirs(os.path.dirname(stranger), exist_ok=True)
        with open(stranger, "w") as f:
            f.write("mine")
        res = self.dsfs("cache", "clear", self.tier, redis=False)
        self.assertIn(f"{FILES} objects removed", res.stdout)
        self.assertEqual(glob.glob(os.path.join(self.tier, "objects", "*", "*")), [stranger])
        shown = json.loads(self.dsfs("cache", "show", self.tier, "--json", redis=False).stdout)
        self.assertEqual((shown["objects"], shown["in_use_by_pid"]), (0, None))
        # The next mount starts cold, and right.
        mnt = self.mount_with_tier()
        self.epoch(mnt, seed=2)
        self.assertEqual(self.stats(mnt)["disk_tier"]["hits"], 0)

    def test_dsfs_cache_names_a_directory_that_is_no_tier(self):
        for command in ("show", "clear"):
            res = self.dsfs("cache", command, self.src, redis=False, check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("is not a dsfs disk cache", res.stderr)


if __name__ == "__main__":
    unittest.main()
