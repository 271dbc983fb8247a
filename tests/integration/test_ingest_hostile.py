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
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import DSFS, DsfsTestCase, run


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

    def test_no_external_decompressor_is_ever_run(self):
        # libarchive's "all filters" runs lrzip, lzop or grzip from PATH for data that starts
        # with their magic (no library for them): an ingest of an untrusted file must not run
        # a program. Fake ones on PATH record whether they were run.
        fake_bin = os.path.join(self.tmp, "fake-bin")
        os.makedirs(fake_bin)
        ran = os.path.join(self.tmp, "ran")
        for program in ("lrzip", "lzop", "grzip"):
            script = os.path.join(fake_bin, program)
            with open(script, "w") as f:
                f.write(f"#!/bin/sh\necho {program} >> '{ran}'\ncat >/dev/null\n")
            os.chmod(script, 0o755)
        env = dict(self.env, PATH=fake_bin + os.pathsep + self.env.get("PATH", os.defpath))
        magics = {
            "lrz": b"LRZI\x00\x06" + bytes(18),
            "lzo": b"\x89LZO\x00\r\n\x1a\n" + bytes(40),
            "grz": b"GRZipII\x00\x02\x04:)" + bytes(40),
        }
        for suffix, data in magics.items():
            with self.subTest(compression=suffix):
                if os.path.exists(ran):
                    os.remove(ran)
                path = self.write(f"x.tar.{suffix}", data + self.tar)
                res = run([DSFS, "ingest", path, "--dataset", "ds", "--redis", self.redis.url],
                          check=False, env=env)
                self.assertNotEqual(res.returncode, 0, res.stdout)
                self.assertIn(path, res.stderr)
                if os.path.exists(ran):
                    with open(ran) as f:
                        self.fail(f"dsfs ingest of {path} ran {f.read().strip()}")
        self.assertEqual(self.info()["generation"], self.generation)

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


class SymlinkIngestTest(DsfsTestCase):
    """A link in a directory source that leads outside it is followed with a warning naming it
    (ImageFolder parity), refused with --symlinks inside, and skipped, like every link, with
    --symlinks none or --no-follow-symlinks (which used to follow file links)."""

    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(self.src, "cls"))
        with open(os.path.join(self.src, "cls", "a.jpg"), "wb") as f:
            f.write(b"inside")
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(outside)
        self.secret = os.path.join(outside, "secret.txt")
        with open(self.secret, "wb") as f:
            f.write(b"not for the dataset")
        os.symlink(self.secret, os.path.join(self.src, "cls", "escape.jpg"))
        os.symlink("a.jpg", os.path.join(self.src, "cls", "inner.jpg"))

    def file_count(self, name):
        return json.loads(self.dsfs("info", name, "--json").stdout)["file_count"]

    def test_an_escaping_link_is_followed_with_a_warning_by_default(self):
        res = self.dsfs("ingest", self.src, "--dataset", "all")
        self.assertIn("escape.jpg", res.stderr)
        self.assertIn("outside the source tree", res.stderr)
        self.assertEqual(self.file_count("all"), 3)

    def test_symlinks_inside_refuses_an_escaping_link(self):
        res = self.dsfs("ingest", self.src, "--dataset", "inside", "--symlinks", "inside",
                        check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("escape.jpg", res.stderr)
        self.assertIn("--symlinks inside", res.stderr)
        self.assertNotIn("inside", self.dsfs("list").stdout)
        os.remove(os.path.join(self.src, "cls", "escape.jpg"))
        self.dsfs("ingest", self.src, "--dataset", "inside", "--symlinks", "inside")
        self.assertEqual(self.file_count("inside"), 2)  # a link inside the tree is fine

    def test_no_follow_skips_file_links_too(self):
        for flags, name in ((["--symlinks", "none"], "none"), (["--no-follow-symlinks"], "nf")):
            with self.subTest(flags=flags):
                self.dsfs("ingest", self.src, "--dataset", name, *flags)
                self.assertEqual(self.file_count(name), 1)

    def test_a_source_path_that_is_not_utf8_keeps_the_json_listings_valid(self):
        """A dataset ingested from a directory named in Latin-1: `list --json` failed for every
        dataset, and `info --json` for it, with nlohmann's "invalid UTF-8 byte"."""
        latin1 = os.path.join(os.fsencode(self.tmp), b"caf\xe9-src")
        shutil.copytree(os.fsencode(self.src), latin1)
        self.dsfs("ingest", os.fsdecode(latin1), "--dataset", "latin")
        listed = json.loads(self.dsfs("list", "--json").stdout)
        self.assertIn("latin", [d["name"] for d in listed])
        info = json.loads(self.dsfs("info", "latin", "--json").stdout)
        self.assertIn("caf\ufffd-src", info["source"])

    def test_names_with_control_bytes_reach_no_terminal_unescaped(self):
        # A directory named with an escape sequence and a newline: each warning about what is
        # skipped in it, and `dsfs info`'s source, show them escaped. Before, the dangling-link,
        # fifo and loop warnings, the missing-source error and the source line printed them raw.
        evil = os.path.join(self.src, "cls", "ev\x1b[2Jil\ndir")  # not a class: a subfolder
        os.makedirs(evil)
        os.symlink("nowhere", os.path.join(evil, "dangling.jpg"))
        os.mkfifo(os.path.join(evil, "pipe.jpg"))
        os.symlink("..", os.path.join(evil, "loop"))
        res = self.dsfs("ingest", self.src, "--dataset", "odd")
        for what in ("dangling.jpg", "pipe.jpg", "loop"):
            self.assertIn(f"ev\\x1b[2Jil\\ndir/{what}", res.stderr)
        self.assertNotIn("\x1b", res.stderr)
        missing = self.dsfs("ingest", evil + "-missing", "--dataset", "odd2", check=False)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("does not exist", missing.stderr)
        self.assertNotIn("\x1b", missing.stderr)
        self.dsfs("ingest", evil, "--dataset", "odd3")  # all of it skipped: no files
        info = self.dsfs("info", "odd3").stdout
        self.assertIn("ev\\x1b[2Jil\\ndir", info)
        self.assertNotIn("\x1b", info)


class TricklingHandler(BaseHTTPRequestHandler):
    """Announces 200 bytes, then sends one every 0.3 s (a server that never quite stalls)."""
    stop = threading.Event()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "200")
        self.end_headers()
        try:
            for _ in range(200):
                if self.stop.wait(0.3):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:
            pass  # the client gave up

    def log_message(self, *args):
        pass


class UrlDeadlineTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        TricklingHandler.stop.clear()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), TricklingHandler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def tearDown(self):
        TricklingHandler.stop.set()
        self.server.shutdown()
        self.server.server_close()
        super().tearDown()

    def test_a_trickling_server_fails_the_ingest_by_its_deadline(self):
        url = f"http://127.0.0.1:{self.server.server_port}/slow.jpg"
        listing = os.path.join(self.tmp, "urls.txt")
        with open(listing, "w") as f:
            f.write(url + "\n")
        started = time.monotonic()
        res = self.dsfs("ingest", listing, "--dataset", "slow", "--url-min-rate", "1KiB",
                        "--url-stall-timeout", "1s", "--url-timeout", "4s", check=False,
                        timeout=120)
        elapsed = time.monotonic() - started
        self.assertNotEqual(res.returncode, 0)
        self.assertIn(url, res.stderr)
        self.assertLess(elapsed, 60, "hang guard: the deadline did not end the ingest")
        self.assertGreaterEqual(elapsed, 1.0)  # at least one stall window was waited
        self.assertNotIn("slow", self.dsfs("list").stdout)


if __name__ == "__main__":
    unittest.main()
