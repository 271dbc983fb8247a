"""A real client: torchvision's ImageFolder through a multi-worker DataLoader sees the same
classes, labels and decoded tensors over the mount as over the source directory."""
import os
import unittest

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from harness import DSFS, DsfsTestCase, run


class TorchvisionTest(DsfsTestCase):
    def test_imagefolder_through_dataloader(self):
        src = os.path.join(self.tmp, "src")
        run([DSFS, "synth", src, "--classes", "4", "--per-class", "12", "--seed", "3"])
        self.dsfs("ingest", src, "--dataset", "tv")
        mnt = self.mount()
        tf = transforms.Compose([transforms.Resize(64), transforms.CenterCrop(64),
                                 transforms.ToTensor()])
        a = datasets.ImageFolder(src, transform=tf)
        b = datasets.ImageFolder(os.path.join(mnt, "tv"), transform=tf)
        self.assertEqual(a.classes, b.classes)
        self.assertEqual(a.class_to_idx, b.class_to_idx)
        self.assertEqual([(os.path.relpath(p, src), y) for p, y in a.samples],
                         [(os.path.relpath(p, os.path.join(mnt, "tv")), y) for p, y in b.samples])
        la = DataLoader(a, batch_size=8, shuffle=False, num_workers=3)
        lb = DataLoader(b, batch_size=8, shuffle=False, num_workers=3)
        batches = 0
        for (xa, ya), (xb, yb) in zip(la, lb):
            self.assertTrue(torch.equal(ya, yb))
            self.assertTrue(torch.equal(xa, xb))
            batches += 1
        self.assertEqual(batches, (len(a) + 7) // 8)


if __name__ == "__main__":
    unittest.main()
