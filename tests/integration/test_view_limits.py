"""Memory bounds of MOUNT/.views and MOUNT/.dsfs/plan through the real dsfs binary, a real
redis-server and a real FUSE mount: a small image claiming huge dimensions is refused by its
header; a SPEC whose files could not stay in the view cache does not exist; concurrent renders
share one memory budget; a plan line without a newline is not buffered. The daemon's peak
resident memory (VmHWM in /proc) is asserted to stay under stated bounds, with margin: bounds,
not speed figures. Every refusal is one log line saying why, with user bytes escaped."""
import errno
import os
import struct
import threading
import zlib

import numpy as np
from PIL import Image

from harness import DsfsTestCase

MiB = 1 << 20


def png_claiming(width, height):
    """A valid PNG header claiming width x height RGB pixels, with a few bytes of image data:
    a decompression bomb of under 100 bytes."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def daemon_pid(mnt):
    mnt = os.path.abspath(mnt)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if "mount" in argv and mnt in argv[argv.index("mount") + 1:]:
            return int(entry)
    raise AssertionError(f"no dsfs daemon serves {mnt}")


def peak_rss(pid):
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


class ViewAndPlanLimits(DsfsTestCase):
    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        os.makedirs(src)
        rng = np.random.default_rng(7)
        self.photos = []
        for i in range(3):
            rel = f"photo{i}.jpg"
            pixels = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(src, rel), quality=90)
            self.photos.append(rel)
        self.bomb = png_claiming(13000, 13000)
        with open(os.path.join(src, "bomb.png"), "wb") as f:
            f.write(self.bomb)
        self.dsfs("ingest", src, "--dataset", "lim")
        self.log = os.path.join(self.tmp, "mount.log")

    def mount_logged(self, *extra, name="mnt"):
        mnt = self.mount("--view-backend", "cpu", "--log-file", self.log, *extra, name=name)
        return mnt, daemon_pid(mnt)

    def log_lines(self):
        with open(self.log, "rb") as f:
            return f.read().split(b"\n")

    def assert_log_is_bounded_and_escaped(self):
        for line in self.log_lines():
            self.assertLess(len(line), 2048, line[:300])
            self.assertFalse(any(b < 0x20 and b != 0x09 or b == 0x7F for b in line),
                             f"a raw control character in the log: {line[:300]!r}")

    def test_a_decompression_bomb_is_refused_by_its_header(self):
        mnt, pid = self.mount_logged()
        before = peak_rss(pid)
        view = os.path.join(mnt, ".views", "imagenet-eval", "lim", "bomb.png.npy")
        with self.assertRaises(OSError) as raised:
            with open(view, "rb") as f:
                f.read()
        self.assertEqual(raised.exception.errno, errno.EIO)
        # The source itself reads as stored.
        with open(os.path.join(mnt, "lim", "bomb.png"), "rb") as f:
            self.assertEqual(f.read(), self.bomb)
        # 13000 x 13000 RGB would be 507 MB decoded; nothing near that was allocated.
        grown = peak_rss(pid) - before
        self.assertLess(grown, 64 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB")
        refusals = [line for line in self.log_lines() if b"13000x13000" in line]
        self.assertEqual(len(refusals), 1, refusals)
        self.assertIn(b"--view-max-pixels", refusals[0])
        self.assertIn(b"bomb.png", refusals[0])
        self.assertEqual(self.stats(mnt)["views"]["render_errors"], 1)

    def test_the_pixel_limit_is_an_option(self):
        mnt, _ = self.mount_logged("--view-max-pixels", str(400 * 300 - 1))
        with self.assertRaises(OSError) as raised:
            with open(os.path.join(mnt, ".views", "imagenet-eval", "lim", "photo0.jpg.npy"),
                      "rb") as f:
                f.read()
        self.assertEqual(raised.exception.errno, errno.EIO)
        self.assertTrue(any(b"more than the 119999 pixels" in line for line in self.log_lines()))
        bad = self.dsfs("mount", os.path.join(self.tmp, "nomnt"), "--view-max-pixels", "0",
                        check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--view-max-pixels", bad.stderr)

    def test_a_spec_too_large_for_the_view_cache_does_not_exist(self):
        mnt, pid = self.mount_logged("--view-cache-size", "64MiB")
        before = peak_rss(pid)
        for spec, size in [("resize=8192,crop=8192", 805306496),
                           ("crop=4096,dtype=uint8,layout=hwc", 50331776)]:
            with self.subTest(spec=spec):
                with self.assertRaises(FileNotFoundError):
                    os.stat(os.path.join(mnt, ".views", spec))
                with self.assertRaises(FileNotFoundError):
                    with open(os.path.join(mnt, ".views", spec, "lim", "photo0.jpg.npy"),
                              "rb") as f:
                        f.read(MiB)
                why = [line for line in self.log_lines() if spec.encode() in line]
                self.assertTrue(why, "the refusal is logged")
                self.assertIn(f"{size} bytes".encode(), why[0])
                self.assertIn(b"half of --view-cache-size", why[0])
        # A SPEC within the limit works (3 x 2048 x 2048 bytes = 12 MiB a file).
        with open(os.path.join(mnt, ".views", "crop=2048,dtype=uint8", "lim", "photo1.jpg.npy"),
                  "rb") as f:
            self.assertEqual(len(f.read()), 3 * 2048 * 2048 + 128)
        grown = peak_rss(pid) - before
        self.assertLess(grown, 128 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB")

    def test_concurrent_renders_share_the_render_memory_budget(self):
        # One render of crop=2048 float32 holds its 48 MiB file, 12 MiB of pixels, 2.3 MiB of
        # rows and 0.4 MiB decoded: 63 MiB. The budget fits one at a time.
        spec = "crop=2048,dtype=float32"
        mnt, pid = self.mount_logged("--view-cache-size", "256MiB", "--view-render-memory",
                                     "100MiB", "--prefetch", "off")
        results, errors = {}, []

        def read(rel):
            try:
                with open(os.path.join(mnt, ".views", spec, "lim", rel + ".npy"), "rb") as f:
                    results[rel] = f.read()
            except OSError as e:
                errors.append((rel, e))

        threads = [threading.Thread(target=read, args=(rel,)) for rel in self.photos]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for rel in self.photos:
            self.assertEqual(len(results[rel]), 3 * 2048 * 2048 * 4 + 128, rel)
        memory = self.stats(mnt)["views"]["render_memory"]
        self.assertEqual(memory["capacity_bytes"], 100 * MiB)
        self.assertGreater(memory["peak_bytes"], 48 * MiB)
        self.assertLessEqual(memory["peak_bytes"], 100 * MiB, memory)
        self.assertEqual(memory["timed_out"], 0)
        # Three files of 48 MiB are cached, plus at most one render in flight, plus the process.
        self.assertLess(peak_rss(pid), 400 * MiB)
        # A render that alone needs more than the budget is refused, once, with the reason.
        small, _ = self.mount_logged("--view-render-memory", "16MiB", "--prefetch", "off",
                                     name="small")
        with self.assertRaises(OSError) as raised:
            with open(os.path.join(small, ".views", spec, "lim", "photo0.jpg.npy"), "rb") as f:
                f.read()
        self.assertEqual(raised.exception.errno, errno.EIO)
        self.assertEqual(self.stats(small)["views"]["render_memory"]["refused"], 1)
        self.assertTrue(any(b"--view-render-memory" in line and b"photo0.jpg" in line
                            for line in self.log_lines()))

    def test_a_plan_line_without_a_newline_is_not_buffered(self):
        mnt, pid = self.mount_logged("--prefetch", "plan")
        before = peak_rss(pid)
        chunk = b"\x1b[31m" + b"a" * (MiB - 5)
        with open(os.path.join(mnt, ".dsfs", "plan"), "wb", buffering=0) as f:
            for _ in range(128):  # 128 MiB in one line
                f.write(chunk)
            f.write(b"\nlim/photo1.jpg\nlim/\x07nothing\n")
        grown = peak_rss(pid) - before
        self.assertLess(grown, 32 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB")
        plan = self.stats(mnt)["prefetch"]["plan"]
        self.assertEqual(plan["entries"], 1, plan)
        self.assertEqual(plan["unresolved"], 2, plan)
        self.assertTrue(any(b"longer than 4096 bytes" in line and b"\\x1b[31m" in line
                            for line in self.log_lines()))
        self.assert_log_is_bounded_and_escaped()
        self.assertLess(os.path.getsize(self.log), 64 * 1024)


if __name__ == "__main__":
    import unittest
    unittest.main()
