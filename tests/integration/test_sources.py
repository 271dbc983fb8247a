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


if __name__ == "__main__":
    unittest.main()
