"""Hostile ingest sources (issue 11): a damaged compressed tarball and a URL list with a line that
is not http(s) fail the ingest with an error naming the problem, and publish nothing (the
dataset's current generation and bytes stay as they were). The real dsfs binary and a real
redis-server; archives are made with Python's tarfile/gzip/bz2/lzma and the zstd tool."""
import io
import json
import os
import shutil
import subprocess
import tarfile
import unittest

from harness import DsfsTestCase


def flip_byte(data, position):
    damaged = bytearray(data)
    damaged[position] ^= 0x01
    return bytes(damaged)


class HostileIngestTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        self.files = {f"c/{i}.bin": os.urandom(50_000 + i) for i in range(4)}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, data in self.files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        self.tar = buffer.getvalue()
        # A good generation first: a failed ingest must leave it current.
        self.write("good.tar", self.tar)
        self.dsfs("ingest", os.path.join(self.tmp, "good.tar"), "--dataset", "ds")
        self.generation = self.info()["generation"]

    def write(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def info(self):
        return json.loads(self.dsfs("info", "ds", "--json").stdout)

    def compressed(self, suffix):
        if suffix == "gz":
            import gzip
            return gzip.compress(self.tar)
        if suffix == "bz2":
            import bz2
            return bz2.compress(self.tar)
        if suffix == "xz":
            import lzma
            return lzma.compress(self.tar)  # CRC-64 check by default
        if suffix == "zst":
            if not shutil.which("zstd"):
                self.fail("zstd is not installed (scripts/install-deps installs it)")
            return subprocess.run(["zstd", "-q", "-c", "--check"], input=self.tar,
                                  capture_output=True, check=True).stdout
        raise ValueError(suffix)

    def assert_refused(self, path, *expected):
        res = self.dsfs("ingest", path, "--dataset", "ds", check=False)
        self.assertNotEqual(res.returncode, 0, f"{path} was ingested: {res.stdout}")
        for text in expected:
            self.assertIn(text, res.stderr)
        self.assertEqual(self.info()["generation"], self.generation)

    def test_every_compression_check_is_enforced(self):
        for suffix in ("gz", "bz2", "xz", "zst"):
            good = self.compressed(suffix)
            with self.subTest(compression=suffix):
                # The intact archive ingests, as a new generation with the same bytes.
                path = self.write(f"ok.tar.{suffix}", good)
                self.dsfs("ingest", path, "--dataset", "ok-" + suffix)
                damaged = {
                    "middle": flip_byte(good, len(good) // 2),
                    "trailer": flip_byte(good, len(good) - 6),
                    "truncated": good[:-9],
                }
                for kind, data in damaged.items():
                    path = self.write(f"{kind}.tar.{suffix}", data)
                    self.assert_refused(path, "is damaged", path)

    def test_a_gzip_crc_error_alone_is_refused(self):
        # Only the stored CRC-32 is wrong: the deflate stream decodes to the original bytes, so
        # nothing but the CRC check can catch it (gzip -t does).
        good = self.compressed("gz")
        path = self.write("crc.tar.gz", flip_byte(good, len(good) - 8))
        self.assertNotEqual(subprocess.run(["gzip", "-t", path], capture_output=True).returncode, 0)
        self.assert_refused(path, "is damaged", "incorrect data check")

    def test_bytes_after_the_last_gzip_member_are_refused_but_zero_padding_is_not(self):
        good = self.compressed("gz")
        self.assert_refused(self.write("tail.tar.gz", good + b"trailing"), "is damaged")
        self.dsfs("ingest", self.write("pad.tar.gz", good + bytes(1024)), "--dataset", "padded")

    def test_a_url_list_with_a_line_that_is_not_http_is_refused_naming_it(self):
        for line in ("file:///etc/passwd", "gopher://example.com/a.jpg", "ftp://example.com/a",
                     "htp://example.com/a.jpg"):
            with self.subTest(line=line):
                path = self.write("list.txt",
                                  f"# images\nhttp://127.0.0.1:9/a.jpg\n{line}\n".encode())
                self.assert_refused(path, "line 3 is not an http(s) URL", line)
        # Only non-http lines: still a list with bad lines, never an (mtree) archive.
        self.assert_refused(self.write("only.txt", b"file:///etc/passwd\n"), "line 1")
        self.assertNotIn("only", self.dsfs("list").stdout)


if __name__ == "__main__":
    unittest.main()
