#!/usr/bin/python3
"""Reads one epoch of an ImageFolder tree through a PyTorch DataLoader and prints images/s.

    read_epoch.py ROOT [--workers 4] [--batch-size 64] [--decode|--raw] [--epochs 1]
                  [--limit N] [--seed S] [--json F]

--decode (default) runs torchvision's ImageNet eval transform in the workers (what a training
loader does); --raw only reads the file bytes (what storage alone delivers).
"""
import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms


class RawBytes(Dataset):
    """ImageFolder's file list and labels, but yields the byte count instead of a decoded image."""

    def __init__(self, root):
        self.samples = datasets.ImageFolder(root).samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return len(f.read()), label


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0,
                    help="read only a random N of the images each epoch (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffling sampler")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--raw", action="store_true", help="read bytes only, no decoding")
    mode.add_argument("--decode", action="store_true", help="decode + eval transform (default)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()

    if not os.path.isdir(args.root):
        sys.exit(f"read_epoch: {args.root} is not a directory")
    if args.raw:
        ds = RawBytes(args.root)
    else:
        tf = transforms.Compose([
            transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        ds = datasets.ImageFolder(args.root, transform=tf)
    generator = torch.Generator().manual_seed(args.seed)
    if args.limit > 0:
        sampler = torch.utils.data.RandomSampler(ds, num_samples=min(args.limit, len(ds)),
                                                 generator=generator)
    else:
        sampler = torch.utils.data.RandomSampler(ds, generator=generator)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    results = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        images = 0
        for _, labels in loader:
            images += len(labels)
        seconds = time.perf_counter() - start
        rate = images / seconds if seconds > 0 else 0.0
        results.append({"epoch": epoch, "images": images, "seconds": seconds, "images_per_s": rate})
        print(f"epoch {epoch}: {images} images in {seconds:.2f} s = {rate:.0f} images/s "
              f"({'raw bytes' if args.raw else 'decoded + transformed'}, {args.workers} workers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"root": args.root, "workers": args.workers, "raw": args.raw,
                       "torch": torch.__version__, "epochs": results}, f, indent=2)


if __name__ == "__main__":
    main()
