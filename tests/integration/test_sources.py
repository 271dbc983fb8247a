"""Ingest sources beyond a plain directory, end to end through the mount: per-sample metadata
(JSONL), a URL list served over HTTP, and --labels none."""
import contextlib
import http.server
import json
import os
import threading
import unittest

from harness import DSFS, DsfsTestCase, run


@contextlib.contextmanager
def http_server(root):
    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=root, **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def sanitized_build():
    """Whether the dsfs under test links a sanitizer's runtime (ASan, TSan)."""
    linked = run(["ldd", DSFS], check=False).stdout
    return "libasan" in linked or "libtsan" in linked


def write_random_files(directory, prefix, count, size):
    """Writes DIRECTORY/PREFIX{i}.bin of `size` random bytes each; returns {name: bytes}."""
    os.makedirs(directory)
    files = {}
    for i in range(count):
        files[f"{prefix}{i}.bin"] = os.urandom(size)
        with open(os.path.join(directory, f"{prefix}{i}.bin"), "wb") as f:
            f.write(files[f"{prefix}{i}.bin"])
    return files


class SourcesTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        self.src = os.path.join(self.tmp, "src")
        run([DSFS, "synth", self.src, "--classes", "2", "--per-class", "5", "--seed", "11"])

    def test_metadata_jsonl(self):
        meta_file = os.path.join(self.tmp, "meta.jsonl")
        with open(meta_file, "w") as f:
            f.write(json.dumps({"path": "class_0000/img_000001.JPEG", "bbox": [1, 2, 30, 40],
                                "caption": "ünïcode caption"}) + "\n")
            f.write(json.dumps({"path": "class_0001/img_000003.JPEG", "split": "val"}) + "\n")
        self.dsfs("ingest", self.src, "--dataset", "m", "--metadata", meta_file)
        mnt = self.mount()
        path = os.path.join(mnt, "m", "class_0000", "img_000001.JPEG")
        meta = json.loads(os.getxattr(path, "user.dsfs.meta"))
        self.assertEqual(meta, {"bbox": [1, 2, 30, 40], "caption": "ünïcode caption"})
        no_meta = os.path.join(mnt, "m", "class_0000", "img_000002.JPEG")
        self.assertNotIn("user.dsfs.meta", os.listxattr(no_meta))
        with open(os.path.join(mnt, ".meta", "m", "metadata.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        self.assertEqual(sorted(r["path"] for r in rows),
                         ["class_0000/img_000001.JPEG", "class_0001/img_000003.JPEG"])
        self.assertEqual(next(r for r in rows if r["path"].startswith("class_0001"))["split"],
                         "val")

    def test_malformed_metadata_is_an_error(self):
        meta_file = os.path.join(self.tmp, "bad.jsonl")
        with open(meta_file, "w") as f:
            f.write('{"path": "class_0000/img_000001.JPEG"}\n{not json\n')
        res = self.dsfs("ingest", self.src, "--dataset", "m", "--metadata", meta_file,
                        check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("bad.jsonl:2", res.stderr)
        self.assertNotIn("m", self.dsfs("list").stdout.split())

    def test_metadata_nested_too_deep_is_refused_naming_its_line(self):
        """60,000 levels of nesting were accepted, and the first read of
        .meta/NAME/metadata.jsonl overflowed the stack of the daemon's FUSE thread (the mount
        died); 70,000 crashed the ingest itself."""
        meta_file = os.path.join(self.tmp, "deep.jsonl")
        depth = 60000
        with open(meta_file, "w") as f:
            f.write('{"path": "class_0000/img_000001.JPEG", "ok": [[1]]}\n')
            f.write('{"path": "class_0000/img_000002.JPEG", "x": ' + "[" * depth + "]" * depth
                    + "}\n")
        res = self.dsfs("ingest", self.src, "--dataset", "deep", "--metadata", meta_file,
                        check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("deep.jsonl:2", res.stderr)
        self.assertIn("nests 60001 levels deep", res.stderr)
        self.assertNotIn("deep", self.dsfs("list").stdout.split())

    def test_url_list(self):
        with http_server(self.src) as base:
            rels = sorted(os.path.relpath(os.path.join(d, n), self.src)
                          for d, _, names in os.walk(self.src) for n in names)
            url_list = os.path.join(self.tmp, "urls.txt")
            with open(url_list, "w") as f:
                f.write("# a comment, then one URL per line\n\n")
                for rel in rels:
                    f.write(f"{base}/{rel}\n")
            self.dsfs("ingest", url_list, "--dataset", "web")
            with open(url_list, "a") as f:
                f.write(f"{base}/class_0000/missing.JPEG\n")
            res = self.dsfs("ingest", url_list, "--dataset", "web2", check=False)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("missing.JPEG", res.stderr)
        mnt = self.mount()
        run(["diff", "-r", self.src, os.path.join(mnt, "web")])
        self.assertNotIn("web2", os.listdir(mnt))
        with open(os.path.join(mnt, ".meta", "web", "classes.txt")) as f:
            self.assertEqual(f.read().split(), ["class_0000", "class_0001"])

    def test_labels_none(self):
        self.dsfs("ingest", self.src, "--dataset", "plain", "--labels", "none")
        mnt = self.mount()
        path = os.path.join(mnt, "plain", "class_0000", "img_000001.JPEG")
        self.assertNotIn("user.dsfs.label", os.listxattr(path))
        with open(os.path.join(mnt, ".meta", "plain", "classes.txt")) as f:
            self.assertEqual(f.read(), "")

    def peak_rss_of(self, *args):
        """Runs `dsfs ARGS --redis URL` as the only child of a fresh Python and returns its peak
        resident set in bytes (ru_maxrss of that process's children)."""
        probe = ("import resource, subprocess, sys\n"
                 "subprocess.run(sys.argv[1:], check=True)\n"
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
        res = run(["/usr/bin/python3", "-c", probe, DSFS, *map(str, args), "--redis",
                   self.redis.url], env=self.env, timeout=120)
        return int(res.stdout.split()[-1]) * 1024

    def test_max_in_flight_bounds_memory_with_chunks_larger_than_it(self):
        """Sixteen jobs each read an 8 MiB chunk into memory before it counted against a bound of
        2 MiB, and each thread's malloc arena kept a chunk's worth once freed: a peak of about
        245 MB here. A chunk is counted before it is read now (one such chunk at a time), and
        chunk buffers are given back when freed: about 57 MB (the chunk, its SET on the wire, a
        1 MiB read block per job, the process)."""
        big = os.path.join(self.tmp, "big")
        sources = write_random_files(big, "f", 16, 12 << 20)
        peak = self.peak_rss_of("ingest", big, "--dataset", "big", "--chunk-size", "8MiB",
                                "-j", "16", "--max-in-flight", "2MiB", "--progress", "none")
        # A sanitizer's allocator (its shadow memory, its quarantine of freed blocks) sets its
        # own RSS: the bound is glibc malloc's, checked on the release build.
        if not sanitized_build():
            self.assertLess(peak, 12 * (8 << 20), f"peak RSS {peak >> 20} MiB")
        mnt = self.mount()
        for name, data in sources.items():
            with open(os.path.join(mnt, "big", name), "rb") as f:
                self.assertTrue(f.read() == data, f"{name} differs from the source")

    def test_a_url_source_of_unknown_sizes_with_chunks_past_the_bound_completes(self):
        """Sizes unknown (no size hint from a URL list), each download's bytes are counted as
        they come; jobs that each hold part of a chunk larger than the bound never wait on one
        another (a hang guard), and every byte arrives."""
        web = os.path.join(self.tmp, "web")
        sources = write_random_files(web, "u", 3, 20 << 20)
        with http_server(web) as base:
            urls = os.path.join(self.tmp, "urls.txt")
            with open(urls, "w") as f:
                f.write("".join(f"{base}/{name}\n" for name in sources))
            self.dsfs("ingest", urls, "--dataset", "web", "--chunk-size", "8MiB", "-j", "3",
                      "--max-in-flight", "4MiB", "--progress", "none", timeout=120)
        mnt = self.mount()
        names = os.listdir(os.path.join(mnt, "web"))
        self.assertEqual(len(names), 3)
        got = {}
        for root, _, files in os.walk(os.path.join(mnt, "web")):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    got[name] = f.read()
        self.assertEqual(sorted(len(v) for v in got.values()), [20 << 20] * 3)
        self.assertEqual(sorted(got.values()), sorted(sources.values()))


if __name__ == "__main__":
    unittest.main()
