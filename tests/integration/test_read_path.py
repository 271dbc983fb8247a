"""The read path's kernel round trips through a real `dsfs mount`: files skip OPEN/RELEASE, an
image up to the readahead arrives in one READ, and a re-read comes from the page cache."""
import mmap
import os
import time
import unittest

from harness import DsfsTestCase


def drop_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class ReadPathTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src", "cls")
        os.makedirs(src)
        # Sizes around the kernel's 128 KiB default readahead and the 1 MiB the mount asks for.
        self.sizes = {"small.bin": 1000, "image.bin": 110_000, "large.bin": 600_000,
                      "huge.bin": 3_000_000}
        for name, size in self.sizes.items():
            with open(os.path.join(src, name), "wb") as f:
                f.write(os.urandom(size))
        self.dsfs("ingest", os.path.join(self.tmp, "src"), "--dataset", "rp",
                  "--progress", "none")

    def reads_between(self, before, after):
        """READ requests between two snapshots, less the one that read `before` itself."""
        return after["requests"]["read"] - before["requests"]["read"] - 1

    def read_all(self, path):
        with open(path, "rb", buffering=0) as f:
            data = b""
            while chunk := f.read(1 << 20):
                data += chunk
        return data

    def test_whole_images_arrive_in_one_read_without_open_or_release(self):
        mnt = self.mount()
        for name in ("small.bin", "image.bin", "large.bin"):
            path = os.path.join(mnt, "rp", "cls", name)
            drop_page_cache(path)
            before = self.stats(mnt)
            self.assertEqual(len(self.read_all(path)), self.sizes[name])
            after = self.stats(mnt)
            self.assertEqual(self.reads_between(before, after), 1, name)
            self.assertEqual(after["files_read"] - before["files_read"], 1, name)
        self.assertLessEqual(self.stats(mnt)["requests"]["open"], 1)
        self.assertNotIn("release", self.stats(mnt)["requests"])

    def test_a_cache_too_small_for_files_is_accepted_with_a_warning(self):
        """--cache-size 64KiB (or 0): nothing was prefetched and every file was read past the
        cache, without a word (audit B). Reads stay right; the mount says so once."""
        mnt = os.path.join(self.tmp, "small")
        os.makedirs(mnt)
        res = self.dsfs("mount", mnt, "--cache-size", "64KiB")
        self.mounts.append(mnt)
        self.assertIn("--cache-size 0.1 MiB holds few files", res.stderr)
        with open(os.path.join(self.tmp, "src", "cls", "large.bin"), "rb") as f:
            self.assertEqual(self.read_all(os.path.join(mnt, "rp", "cls", "large.bin")), f.read())

    def test_rereads_come_from_the_page_cache(self):
        mnt = self.mount()
        path = os.path.join(mnt, "rp", "cls", "huge.bin")
        first = self.read_all(path)
        before = self.stats(mnt)
        for _ in range(3):
            self.assertEqual(self.read_all(path), first)
        after = self.stats(mnt)
        self.assertEqual(self.reads_between(before, after), 0)
        self.assertEqual(after["bytes_read"], before["bytes_read"])

    def test_a_shared_writable_mapping_does_not_change_what_readers_get_for_good(self):
        # Root may open a dataset file O_RDWR (the kernel sends no OPEN to refuse it) and map it
        # shared and writable: its stores change the page cache in place, and the writeback is
        # refused. Found by an audit: every later reader got the changed bytes, for good. The
        # mount now drops the file's pages once a write to it is refused.
        mnt = self.mount()
        path = os.path.join(mnt, "rp", "cls", "image.bin")
        with open(os.path.join(self.tmp, "src", "cls", "image.bin"), "rb") as f:
            want = f.read()
        self.assertEqual(self.read_all(path), want)
        fd = os.open(path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            m[0:8] = b"CORRUPT!"
            try:
                m.flush()  # msync: the writeback, refused
            except OSError:
                pass
            m.close()
        finally:
            os.close(fd)
        deadline = time.monotonic() + 30
        while self.read_all(path) != want:
            self.assertLess(time.monotonic(), deadline, "readers still get the mapping's bytes")
            time.sleep(0.05)
        log = os.path.join(self.env["DSFS_HOME"], "logs", "mount-mnt.log")
        with open(log, errors="replace") as f:
            self.assertIn("refused a write to read-only inode", f.read())

    def test_readahead_zero_keeps_the_kernel_default(self):
        mnt = self.mount("--readahead", "0")
        path = os.path.join(mnt, "rp", "cls", "large.bin")
        before = self.stats(mnt)
        self.assertEqual(len(self.read_all(path)), self.sizes["large.bin"])
        after = self.stats(mnt)
        # 128 KiB requests: the same bytes take several READs.
        self.assertGreater(self.reads_between(before, after), 1)


if __name__ == "__main__":
    unittest.main()
