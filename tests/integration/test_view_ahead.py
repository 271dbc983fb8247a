"""Rendering the view ahead, through a real mount and a real redis-server: a plan that names
.views files has them decoded and transformed into the view cache before anyone reads them, byte
for byte what rendering on read gives, never beyond --view-cache-size; undecodable images are EIO
and counted once. Correctness only: the counters of stats.json, never timings."""
import errno
import os
import random
import time
import unittest

import sys

import numpy as np
import torch
import torchvision

from harness import DsfsTestCase, synth_data

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
from dsfs_torch import PlanSampler  # noqa: E402

SPEC = "imagenet-eval"
# 128-byte header, then 3 x 224 x 224 float32.
VIEW_FILE_BYTES = 128 + 3 * 224 * 224 * 4


class ViewAheadTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        synth_data(src, "--classes", "4", "--per-class", "15", "--seed", "5")
        self.good = sorted(os.path.relpath(os.path.join(d, f), src)
                           for d, _, names in os.walk(src) for f in names)
        # Undecodable: a JPEG cut off after its header, and text named .jpg.
        self.bad = ["class_0000/cut_short.JPEG", "class_0001/not_a_jpeg.jpg"]
        with open(os.path.join(src, self.good[0]), "rb") as f:
            jpeg = f.read()
        with open(os.path.join(src, self.bad[0]), "wb") as f:
            f.write(jpeg[:600])
        with open(os.path.join(src, self.bad[1]), "w") as f:
            f.write("this is not an image\n")
        self.dsfs("ingest", src, "--dataset", "va", "--progress", "none")

    def wait_for(self, mnt, what, done, timeout=300):
        """Polls stats.json until done(stats) holds; fails naming `what` after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats(mnt)
            if done(stats):
                return stats
            if time.monotonic() > deadline:
                self.fail(f"{what}: not after {timeout} s; views stats: {stats['views']}")
            time.sleep(0.05)

    def view_path(self, mnt, rel):
        return os.path.join(mnt, ".views", SPEC, "va", rel + ".npy")

    def write_plan(self, mnt, order, extra=()):
        with open(os.path.join(mnt, ".dsfs", "plan"), "w") as f:
            f.write("".join(f".views/{SPEC}/va/{rel}.npy\n" for rel in order))
            f.write("".join(f"{line}\n" for line in extra))

    def read_view(self, mnt, rel):
        with open(self.view_path(mnt, rel), "rb") as f:
            return f.read()

    def reference(self):
        """Every good image's view rendered on read: prefetching and rendering ahead off."""
        ref = self.mount("--prefetch", "off", "--view-render-ahead", "0", name="ref")
        files = {rel: self.read_view(ref, rel) for rel in self.good}
        views = self.stats(ref)["views"]
        self.assertEqual(views["ahead"]["threads"], 0)
        self.assertEqual(views["ahead"]["rendered"], 0)
        self.assertEqual(views["rendered"], len(self.good))
        self.umount(ref)
        return files

    def test_a_planned_epoch_of_view_files_is_rendered_before_it_is_read(self):
        expected = self.reference()
        mnt = self.mount("--view-render-ahead", "2", "--view-cache-size", "256MiB", name="ahead")
        order = self.good + self.bad
        random.Random(1).shuffle(order)
        # One line names a SPEC that does not parse: it stands for nothing.
        self.write_plan(mnt, order, extra=[f".views/resize=oops/va/{self.good[0]}.npy"])
        plan = self.stats(mnt)["prefetch"]["plan"]
        self.assertEqual(plan["entries"], len(order))
        self.assertEqual(plan["unresolved"], 1)

        # Nobody reads yet: the plan alone has every image fetched and rendered.
        views = self.wait_for(
            mnt, "every planned view rendered ahead",
            lambda s: s["views"]["ahead"]["rendered"] == len(self.good)
            and s["views"]["ahead"]["errors"] == len(self.bad))["views"]
        self.assertEqual(views["rendered"], len(self.good))
        self.assertEqual(views["reads"]["ready"] + views["reads"]["miss"], 0)

        for rel in order:
            if rel in self.bad:
                with self.assertRaises(OSError) as caught:
                    self.read_view(mnt, rel)
                self.assertEqual(caught.exception.errno, errno.EIO, rel)
                continue
            data = self.read_view(mnt, rel)
            self.assertEqual(data, expected[rel], rel)
        array = np.load(self.view_path(mnt, self.good[0]))
        self.assertEqual((array.shape, array.dtype), ((3, 224, 224), np.float32))

        views = self.stats(mnt)["views"]
        # Every image was found rendered; none was rendered twice; each bad one counted once.
        self.assertEqual(views["reads"]["ready"], len(self.good), views["reads"])
        self.assertEqual(views["reads"]["miss"], 0, views["reads"])
        self.assertEqual(views["rendered"], len(self.good))
        self.assertEqual(views["render_errors"], len(self.bad))
        self.assertEqual(views["ahead"]["errors"], len(self.bad))
        # The reads reached the prefetch engine as reads of the planned files.
        self.assertEqual(self.stats(mnt)["prefetch"]["plan"]["position"], len(order))

    def test_rendering_ahead_never_exceeds_the_view_cache(self):
        expected = self.reference()
        fits = 12
        capacity = fits * VIEW_FILE_BYTES + VIEW_FILE_BYTES // 2
        mnt = self.mount("--view-render-ahead", "2", "--view-cache-size", str(capacity),
                         name="ahead")
        order = self.good[:]
        random.Random(2).shuffle(order)
        self.write_plan(mnt, order)
        self.wait_for(mnt, f"{fits} views rendered ahead",
                      lambda s: s["views"]["ahead"]["rendered"] >= fits)
        # Settled: the cache is full of rendered views, no render holds a reservation, and the
        # rest wait in the queue for room (nothing frees any until a reader finishes a file).
        views = self.wait_for(
            mnt, "the view cache full and the rest queued",
            lambda s: (s["views"]["cache"]["entries"] == fits
                       and s["views"]["cache"]["reserved_bytes"] == 0
                       and s["views"]["ahead"]["queued"] > 0))["views"]
        cache = views["cache"]
        self.assertLessEqual(cache["bytes"] + cache["reserved_bytes"], capacity, cache)
        self.assertEqual(cache["entries"], fits, cache)
        self.assertGreater(views["ahead"]["queued"], 0, "the rest waits for room")

        for i, rel in enumerate(order):
            self.assertEqual(self.read_view(mnt, rel), expected[rel], rel)
            if i % 8 == 0:
                cache = self.stats(mnt)["views"]["cache"]
                self.assertLessEqual(cache["bytes"] + cache["reserved_bytes"], capacity, cache)
        views = self.stats(mnt)["views"]
        # The first `fits` of the plan were waiting in the cache (the earliest predicted uses
        # keep their room); reading them freed room for more ahead.
        self.assertGreaterEqual(views["reads"]["ready"], fits, views["reads"])
        self.assertGreater(views["ahead"]["rendered"], fits, views["ahead"])
        self.assertLessEqual(views["cache"]["bytes"], capacity)

    def test_unmounting_while_renders_wait_for_room_does_not_hang(self):
        capacity = 4 * VIEW_FILE_BYTES
        mnt = self.mount("--view-render-ahead", "2", "--view-cache-size", str(capacity),
                         name="ahead")
        self.write_plan(mnt, self.good)
        views = self.wait_for(mnt, "the view cache filled ahead",
                              lambda s: s["views"]["ahead"]["rendered"] >= 4
                              and s["views"]["ahead"]["queued"] > 0)["views"]
        self.assertLessEqual(views["cache"]["bytes"] + views["cache"]["reserved_bytes"], capacity)
        self.umount(mnt)  # waits for the daemon to exit; fails if it does not

    def test_a_dataloader_with_a_plan_sampler_over_the_view_gets_it_rendered_ahead(self):
        mnt = self.mount("--view-render-ahead", "2", name="ahead")
        root = os.path.join(mnt, ".views", SPEC, "va")
        bad_names = {os.path.basename(rel) + ".npy" for rel in self.bad}
        dataset = torchvision.datasets.DatasetFolder(
            root, loader=np.load,
            is_valid_file=lambda p: p.endswith(".npy") and os.path.basename(p) not in bad_names)
        self.assertEqual(len(dataset), len(self.good))
        loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2,
                                             sampler=PlanSampler(dataset))
        seen = 0
        for tensors, labels in loader:
            self.assertEqual(tuple(tensors.shape[1:]), (3, 224, 224))
            seen += len(labels)
        self.assertEqual(seen, len(self.good))
        stats = self.stats(mnt)
        self.assertEqual(stats["prefetch"]["plan"]["entries"], len(self.good))
        self.assertEqual(stats["prefetch"]["plan"]["unresolved"], 0)
        plan = next(p for p in stats["prefetch"]["predictors"] if p["name"] == "plan")
        self.assertEqual(plan["foreseen"], len(self.good), plan)  # view reads reached the engine
        views = stats["views"]
        reads = views["reads"]
        self.assertEqual(reads["ready"] + reads["joined"] + reads["miss"], len(self.good), reads)
        self.assertGreater(views["ahead"]["rendered"], 0, views["ahead"])
        # Rendered ahead or on read, each image once.
        self.assertEqual(views["rendered"], len(self.good))

    def test_reading_the_view_in_directory_order_gets_it_rendered_ahead(self):
        # No plan: the engine learns the order from the view reads themselves.
        mnt = self.mount("--view-render-ahead", "2", name="ahead")
        expected = sorted(self.good + self.bad)
        listed = []
        for root, dirs, names in os.walk(os.path.join(mnt, ".views", SPEC, "va")):
            dirs.sort()
            listed += sorted(os.path.relpath(os.path.join(root, n), os.path.join(
                mnt, ".views", SPEC, "va"))[:-len(".npy")] for n in names)
        self.assertEqual(listed, expected)
        for rel in listed:
            try:
                self.read_view(mnt, rel)
            except OSError as e:
                self.assertIn(rel, self.bad)
                self.assertEqual(e.errno, errno.EIO)
        stats = self.stats(mnt)
        self.assertEqual(stats["prefetch"]["leader"], "sequential", stats["prefetch"])
        views = stats["views"]
        self.assertGreater(views["ahead"]["rendered"], 0, views["ahead"])
        self.assertEqual(views["rendered"], len(self.good))

    def test_shuffled_reads_without_a_plan_render_nothing_ahead(self):
        # Any unread image may come next: guesses would mostly be evicted before their read.
        mnt = self.mount("--view-render-ahead", "2", name="ahead")
        order = self.good[:]
        random.Random(3).shuffle(order)
        for rel in order:
            self.read_view(mnt, rel)
        views = self.stats(mnt)["views"]
        self.assertEqual(views["ahead"]["rendered"], 0, views["ahead"])
        self.assertGreater(views["ahead"]["unordered"], 0, views["ahead"])
        self.assertEqual(views["reads"]["miss"] + views["reads"]["joined"], len(self.good))


if __name__ == "__main__":
    unittest.main()
