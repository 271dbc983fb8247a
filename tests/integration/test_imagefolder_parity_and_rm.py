"""End to end: torchvision's ImageFolder assigns the same classes and labels to the source, to
the mount and to .meta when class directories are symlinks or have names that are not UTF-8;
`dsfs rm` refuses a dataset a mount is serving unless --force."""
import os
import unittest

from torchvision import datasets

from harness import DsfsTestCase


def imagefolder(root):
    return datasets.ImageFolder(root, loader=lambda path: path)


class ImageFolderParityTest(DsfsTestCase):
    def test_symlinked_and_non_utf8_class_directories(self):
        src = os.path.join(self.tmp, "src")
        elsewhere = os.path.join(self.tmp, "elsewhere")
        # Python decodes b"\xc3" to U+DCC3, which sorts after "\xc3\xa9" (U+00E9) and before
        # U+E000, unlike the bytes; "Upper" sorts before "lower" by code point.
        names = [b"lower", b"Upper", "\u00e9".encode(), b"\xc3", "\ue000".encode(),
                 "\U0001f600".encode()]
        for i, name in enumerate(names):
            path = os.path.join(os.fsencode(src), name)
            os.makedirs(path)
            with open(os.path.join(path, b"img.jpg"), "wb") as f:
                f.write(b"x" * (i + 1))
        # A class that is a symlink to a directory outside the source, as subsets often are.
        os.makedirs(os.path.join(elsewhere, "b_linked"))
        with open(os.path.join(elsewhere, "b_linked", "img.jpg"), "wb") as f:
            f.write(b"linked")
        os.symlink(os.path.join(elsewhere, "b_linked"), os.path.join(src, "b_linked"))

        self.dsfs("ingest", src, "--dataset", "tv")
        mnt = self.mount()
        expected = imagefolder(src)
        self.assertIn("b_linked", expected.classes)
        mounted = imagefolder(os.path.join(mnt, "tv"))
        self.assertEqual(mounted.classes, expected.classes)
        self.assertEqual(
            [(os.path.relpath(p, os.path.join(mnt, "tv")), y) for p, y in mounted.samples],
            [(os.path.relpath(p, src), y) for p, y in expected.samples])
        with open(os.path.join(mnt, ".meta", "tv", "classes.txt"), "rb") as f:
            listed = f.read().split(b"\n")
        self.assertEqual([c for c in listed if c],
                         [os.fsencode(c) for c in expected.classes])


class RemoveWhileMountedTest(DsfsTestCase):
    def test_rm_refuses_a_mounted_dataset_unless_forced(self):
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "a"))
        with open(os.path.join(src, "a", "1.jpg"), "wb") as f:
            f.write(b"data")
        self.dsfs("ingest", src, "--dataset", "busy")
        mnt = self.mount()
        res = self.dsfs("rm", "busy", check=False)
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn("mounted", res.stderr)
        self.assertIn("--force", res.stderr)
        with open(os.path.join(mnt, "busy", "a", "1.jpg"), "rb") as f:
            self.assertEqual(f.read(), b"data")
        self.dsfs("rm", "busy", "--force")
        self.assertNotIn("busy", self.dsfs("list").stdout)
        self.umount(mnt)
        self.dsfs("ingest", src, "--dataset", "busy")
        self.dsfs("rm", "busy")  # no mount: no lease, no refusal
        self.assertEqual(self.redis.cli("KEYS", "*").split(), ["dsfs:{busy}:nextgen"])


if __name__ == "__main__":
    unittest.main()
