"""Extended attributes at the kernel's size limit, end to end (the real dsfs binary, a real
redis-server and a real FUSE mount): a user.dsfs.meta too long to read is not listed, so tools
that copy every listed xattr work on such files."""
import errno
import json
import os
import shutil
import unittest

from harness import DsfsTestCase


class XattrLimitTest(DsfsTestCase):
    """The kernel passes at most 64 KiB of an xattr value (XATTR_SIZE_MAX): a longer
    user.dsfs.meta cannot be read (E2BIG). It used to be listed all the same, so every tool that
    copies the listed xattrs (shutil.copy2/copytree, getfattr -d, cp --preserve=xattr) failed on
    such files."""

    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c0"))
        for name in ("big.jpg", "small.jpg"):
            with open(os.path.join(src, "c0", name), "wb") as f:
                f.write(name.encode() * 10)
        metadata = os.path.join(self.tmp, "meta.jsonl")
        with open(metadata, "w") as f:
            # Per-sample annotations (e.g. segmentation polygons) can be this large.
            f.write(json.dumps({"path": "c0/big.jpg", "polygons": "1," * 40000}) + "\n")
            f.write(json.dumps({"path": "c0/small.jpg", "polygons": "1,2"}) + "\n")
        self.dsfs("ingest", src, "--dataset", "ds", "--metadata", metadata)
        self.mnt = self.mount()
        self.big = os.path.join(self.mnt, "ds", "c0", "big.jpg")
        self.small = os.path.join(self.mnt, "ds", "c0", "small.jpg")

    def test_only_readable_xattrs_are_listed(self):
        for name in os.listxattr(self.big):
            os.getxattr(self.big, name)  # every listed one can be read
        self.assertNotIn("user.dsfs.meta", os.listxattr(self.big))
        self.assertIn("user.dsfs.label", os.listxattr(self.big))
        self.assertIn("user.dsfs.meta", os.listxattr(self.small))
        with self.assertRaises(OSError) as ctx:
            os.getxattr(self.big, "user.dsfs.meta")
        self.assertEqual(ctx.exception.errno, errno.E2BIG)
        # The metadata itself is still served, in full, by the .meta directory.
        with open(os.path.join(self.mnt, ".meta", "ds", "metadata.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(len(next(l for l in lines if l["path"] == "c0/big.jpg")["polygons"]),
                         80000)

    def test_copytree_from_the_mount_works(self):
        dest = os.path.join(self.tmp, "copy")
        shutil.copytree(os.path.join(self.mnt, "ds"), dest)  # copy2: data, stat and xattrs
        with open(os.path.join(dest, "c0", "big.jpg"), "rb") as f:
            self.assertEqual(f.read(), b"big.jpg" * 10)


if __name__ == "__main__":
    unittest.main()
