"""MOUNT/.views through the real dsfs binary: a dataset of PIL-made images (RGB of several sizes,
grayscale, CMYK, a PNG named .JPEG, undecodable JPEGs, non-image files) is ingested into a real
redis-server and mounted; the .npy files are checked against Debian's torchvision applied to the
source images, and read by a DataLoader with worker processes."""
import errno
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

from harness import DSFS, RedisServer, is_mounted, report_view_diffs, run

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PRESETS = {"imagenet-eval", "imagenet-eval-fp16", "imagenet-eval-uint8"}


def photo_like(width, height, seed):
    """Smooth gradients, hard edges and noise: enough detail for JPEG and resampling to matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1),
                     127.5 + 127.5 * np.sin(x / 7.0) * np.cos(y / 11.0)], axis=-1)
    base[(x // 40 + y // 40) % 2 == 0] *= 0.6
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))


def make_source(root):
    """The dataset tree; returns (decodable images, undecodable images, non-image files), each
    as paths relative to root."""
    good, bad, other = [], [], []

    def save(rel, image, **options):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        image.save(path, **options)
        good.append(rel)

    def write(rel, data, into):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        into.append(rel)

    seed = 0
    for rel, (w, h) in [("train/cat/rgb_500x375.jpg", (500, 375)),
                        ("train/cat/rgb_375x500.JPEG", (375, 500)),
                        ("train/dog/rgb_1000x200.jpeg", (1000, 200)),
                        ("train/dog/rgb_256x256.jpg", (256, 256)),
                        ("train/dog/rgb_100x80.jpg", (100, 80))]:
        seed += 1
        save(rel, photo_like(w, h, seed), format="JPEG", quality=90)
    save("train/cat/gray.jpg", photo_like(320, 240, 20).convert("L"), format="JPEG", quality=90)
    save("train/cat/cmyk.jpg", photo_like(410, 290, 21).convert("CMYK"), format="JPEG",
         quality=90)
    # ImageNet has a PNG named .JPEG: the content decides, not the name.
    save("train/cat/png_named.JPEG", photo_like(260, 390, 22), format="PNG")
    save("train/dog/small.png", photo_like(90, 120, 23), format="PNG")
    write("train/dog/notes.txt", b"not an image\n", other)
    write("train/labels.csv", b"path,label\n", other)

    whole = os.path.join(root, "train/cat/rgb_500x375.jpg")
    with open(whole, "rb") as f:
        jpeg = f.read()
    write("broken/truncated.jpg", jpeg[:len(jpeg) // 2], bad)
    write("broken/garbage.JPEG", b"\xff\xd8\xff\xe0 this is no JPEG at all", bad)
    write("broken/readme.md", b"# nothing to see\n", other)
    return sorted(good), sorted(bad), sorted(other)


def pil_rgb(path):
    with open(path, "rb") as f:  # what torchvision's ImageFolder loader does
        return Image.open(f).convert("RGB")


class ViewsThroughTheMount(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dsfs-views-it-")
        cls.env = dict(os.environ, DSFS_HOME=os.path.join(cls.tmp, "home"))
        cls.env.pop("DSFS_REDIS", None)
        cls.redis = RedisServer(cls.tmp).start()
        cls.source = os.path.join(cls.tmp, "src")
        cls.good, cls.bad, cls.other = make_source(cls.source)
        run([DSFS, "ingest", cls.source, "--dataset", "pics", "--redis", cls.redis.url],
            env=cls.env)
        cls.mnt = os.path.join(cls.tmp, "mnt")
        cls.log = os.path.join(cls.tmp, "mount.log")
        os.makedirs(cls.mnt)
        # No rendering ahead (test_view_ahead.py covers it): these tests read global counters
        # (rendered, render errors) that render-ahead threads would otherwise move under them.
        run([DSFS, "mount", cls.mnt, "--redis", cls.redis.url, "--view-backend", "cpu",
             "--log-file", cls.log, "--view-cache-size", "16MiB", "--view-render-ahead", "0"],
            env=cls.env)
        cls.views = os.path.join(cls.mnt, ".views")
        print(f"\ntorchvision {torchvision.__version__}, PIL {Image.__version__}", flush=True)

    @classmethod
    def tearDownClass(cls):
        if is_mounted(cls.mnt):
            subprocess.run([DSFS, "umount", cls.mnt], capture_output=True, env=cls.env)
        if is_mounted(cls.mnt):
            subprocess.run(["umount", "-l", cls.mnt], capture_output=True)
        cls.redis.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def stats(self):
        with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
            return json.load(f)

    def view(self, spec, rel):
        return os.path.join(self.views, spec, "pics", rel + ".npy")

    def report(self, title, diffs):
        report_view_diffs(self, title, diffs)

    def test_views_is_beside_the_datasets_and_lists_the_presets(self):
        self.assertIn(".views", os.listdir(self.mnt))
        self.assertEqual(set(os.listdir(self.views)), PRESETS)
        self.assertEqual(os.listdir(os.path.join(self.views, "imagenet-eval")), ["pics"])
        # The dataset's own tree is untouched: no .views or .npy inside it.
        self.assertEqual(sorted(os.listdir(os.path.join(self.mnt, "pics"))), ["broken", "train"])
        run(["diff", "-r", self.source, os.path.join(self.mnt, "pics")])

    def test_only_images_are_listed_as_npy(self):
        root = os.path.join(self.views, "imagenet-eval", "pics")
        listed = set()
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                listed.add(os.path.relpath(os.path.join(dirpath, name), root))
        self.assertEqual(listed, {rel + ".npy" for rel in self.good + self.bad})
        for rel in self.other:
            self.assertFalse(os.path.exists(os.path.join(root, rel)), rel)
            self.assertFalse(os.path.exists(os.path.join(root, rel + ".npy")), rel)
        self.assertEqual(sorted(os.listdir(root)), ["broken", "train"])

    def test_stat_gives_the_size_before_any_decoding(self):
        spec = "resize=300,crop=100x60,dtype=float16,layout=hwc"  # read by no other test
        rendered = self.stats()["views"]["rendered"]
        for rel in self.good + self.bad:
            st = os.stat(self.view(spec, rel))
            self.assertEqual(st.st_size, 128 + 60 * 100 * 3 * 2, rel)
        self.assertEqual(self.stats()["views"]["rendered"], rendered)
        array = np.load(self.view(spec, self.good[0]))
        self.assertEqual((array.shape, array.dtype), ((60, 100, 3), np.float16))
        self.assertEqual(os.stat(self.view(spec, self.good[0])).st_size,
                         os.path.getsize(self.view(spec, self.good[0])))

    def test_imagenet_eval_matches_torchvision(self):
        transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                               T.Normalize(MEAN, STD)])
        std = np.array(STD, np.float32).reshape(3, 1, 1)
        diffs = {}
        for rel in self.good:
            path = self.view("imagenet-eval", rel)
            got = np.load(path)
            self.assertEqual((got.shape, got.dtype), ((3, 224, 224), np.float32), rel)
            self.assertEqual(os.path.getsize(path), 128 + 3 * 224 * 224 * 4)
            reference = transform(pil_rgb(os.path.join(self.source, rel))).numpy()
            d = np.abs(got - reference) * std * 255  # in pixel steps, before normalization
            diffs[rel] = (float(d.max()), float(d.mean()))
        self.report("MOUNT/.views/imagenet-eval vs torchvision's eval transform:", diffs)

    def test_float16_uint8_and_hwc_views(self):
        resize_crop = T.Compose([T.Resize(256), T.CenterCrop(224)])
        to_tensor = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        std = np.array(STD, np.float32)
        custom = "resize=128,crop=112,dtype=float16,layout=hwc,norm=imagenet"
        diffs = {}
        for rel in self.good:
            image = pil_rgb(os.path.join(self.source, rel))
            pixels = resize_crop(image)
            half = np.load(self.view("imagenet-eval-fp16", rel))
            self.assertEqual((half.shape, half.dtype), ((3, 224, 224), np.float16), rel)
            d = np.abs(half.astype(np.float32) - to_tensor(pixels).numpy()) * std.reshape(3, 1, 1)
            diffs[f"fp16 {rel}"] = (float(d.max() * 255), float(d.mean() * 255))
            raw = np.load(self.view("imagenet-eval-uint8", rel))
            self.assertEqual((raw.shape, raw.dtype), ((224, 224, 3), np.uint8), rel)
            d = np.abs(raw.astype(np.int32) - np.asarray(pixels).astype(np.int32))
            diffs[f"uint8 {rel}"] = (float(d.max()), float(d.mean()))
            small = np.load(self.view(custom, rel))
            self.assertEqual((small.shape, small.dtype), ((112, 112, 3), np.float16), rel)
            reference = to_tensor(T.CenterCrop(112)(T.Resize(128)(image))).numpy()
            d = np.abs(small.astype(np.float32) - reference.transpose(1, 2, 0)) * std
            diffs[f"custom {rel}"] = (float(d.max() * 255), float(d.mean() * 255))
        self.report("fp16 / uint8 hwc / custom spec views vs torchvision:", diffs)

    def test_two_spellings_of_one_spec_give_the_same_files(self):
        spelled = "norm=imagenet,crop=224,resize=256"
        for rel in self.good[:3]:
            a, b = self.view("imagenet-eval", rel), self.view(spelled, rel)
            self.assertEqual(os.stat(a).st_ino, os.stat(b).st_ino)
            with open(a, "rb") as fa, open(b, "rb") as fb:
                self.assertEqual(fa.read(), fb.read())

    def test_invalid_spec_is_enoent_with_the_reason_in_the_log(self):
        for spec, reason in [("resize=256", "the tensor shape must follow from the spec"),
                             ("crop=224,dtype=float64", 'dtype: "float64" is not a dtype'),
                             ("not-a-preset", "is not key=value nor a preset name")]:
            with self.assertRaises(FileNotFoundError):
                os.stat(os.path.join(self.views, spec))
            with self.assertRaises(FileNotFoundError):
                os.listdir(os.path.join(self.views, spec, "pics"))
            with open(self.log) as f:
                self.assertIn(reason, f.read(), spec)

    def test_undecodable_images_are_eio_and_counted_once(self):
        # A SPEC no other test reads: rendering ahead (on by default) renders the images of the
        # SPEC read last, so a shared one may have met these files already. Each (file, SPEC)
        # counts once, whether a reader or rendering ahead meets it first.
        spec = "resize=40,crop=32,dtype=float32,layout=chw,norm=imagenet"
        before = self.stats()
        for rel in self.bad:
            path = self.view(spec, rel)
            self.assertEqual(os.stat(path).st_size, 128 + 3 * 32 * 32 * 4)  # stat still works
            for _ in range(2):
                with self.assertRaises(OSError) as caught:
                    with open(path, "rb") as f:
                        f.read()
                self.assertEqual(caught.exception.errno, errno.EIO, rel)
        after = self.stats()
        new_errors = after["views"]["render_errors"] - before["views"]["render_errors"]
        self.assertEqual(new_errors, len(self.bad))
        self.assertEqual(after["errors"]["view_render"], after["views"]["render_errors"])
        with open(self.log) as f:
            log = f.read()
        for rel in self.bad:
            self.assertIn(f"{rel} cannot be decoded", log)

    def test_a_dataloader_with_two_workers_reads_the_tensors(self):
        root = os.path.join(self.views, "imagenet-eval", "pics", "train")
        dataset = torchvision.datasets.DatasetFolder(root, loader=np.load, extensions=(".npy",))
        self.assertEqual(dataset.classes, ["cat", "dog"])
        loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2, shuffle=True,
                                             generator=torch.Generator().manual_seed(1))
        seen, labels = 0, []
        for images, targets in loader:
            self.assertEqual(tuple(images.shape[1:]), (3, 224, 224))
            self.assertEqual(images.dtype, torch.float32)
            self.assertTrue(torch.isfinite(images).all())
            seen += images.shape[0]
            labels += targets.tolist()
        train = [rel for rel in self.good if rel.startswith("train/")]
        self.assertEqual(seen, len(train))
        expected = sorted(0 if rel.startswith("train/cat/") else 1 for rel in train)
        self.assertEqual(sorted(labels), expected)


if __name__ == "__main__":
    unittest.main()
