#!/usr/bin/python3
"""Images/s of a PyTorch DataLoader that only reads preprocessed tensors from MOUNT/.views,
against DataLoaders that read the JPEGs and run torchvision's eval transform in their workers.

Synthesizes an ImageNet-like dataset (`dsfs synth`), ingests it into a private redis-server on a
unix socket and mounts it; then, on the same cores, for each of --runs runs (medians reported):

  views, first epoch   DataLoader(--workers) over a Dataset that np.load()s
                       MOUNT/.views/imagenet-eval/bench/**.npy, on a fresh mount: dsfs fetches,
                       decodes and transforms every image (--view-backend, default auto)
  views, second epoch  the same again: the tensors come from the kernel's page cache
  JPEG via dsfs        ImageFolder + Resize(256)/CenterCrop(224)/ToTensor/Normalize in the
                       workers, reading the JPEGs from a fresh mount
  JPEG from tmpfs      the same from a copy of the JPEGs on tmpfs (/dev/shm)
  views + PlanSampler  a first epoch of views whose order dsfs_torch.PlanSampler writes to
                       the plan, rendered on read (--view-render-ahead 0) against rendered
                       ahead (the default), with 1 worker and with --workers

CPU seconds are reported per epoch for the loader (main process and its workers) and for the
dsfs daemon (/proc/PID/stat), so the view's cost is not hidden in another process. Writes
bench/results/view_loader.json and .png and prints a markdown table.

    bench/view_loader.py [--build build] [--images 2000] [--runs 3] [--workers 4]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torchvision
import torchvision.transforms as T

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "python"))
from dsfs_torch import PlanSampler  # noqa: E402
from common import RedisServer, mount_daemon_pid, private_env, process_usage  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
DATASET = "bench"
SPEC = "imagenet-eval"


class NpyFolder(torch.utils.data.Dataset):
    """(tensor, label) from SPEC/NAME/<class>/<image>.npy: reads tensors, nothing else."""

    def __init__(self, root):
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = []
        for label, name in enumerate(self.classes):
            folder = os.path.join(root, name)
            self.samples += [(os.path.join(folder, f), label) for f in sorted(os.listdir(folder))
                             if f.endswith(".npy")]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        return torch.from_numpy(np.load(path)), label


def eval_transform():
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


def cpu_seconds_self_and_children():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def process_cpu_seconds(pid):
    return process_usage(pid)["cpu_s"]


def epoch(dataset, workers, batch, seed, daemon_pid=None, sampler=None):
    """One shuffled pass (in `sampler`'s order when given); returns images/s and CPU seconds
    (loader, dsfs daemon)."""
    if sampler is None:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers,
                                             shuffle=True,
                                             generator=torch.Generator().manual_seed(seed))
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers,
                                             sampler=sampler)
    daemon_before = process_cpu_seconds(daemon_pid) if daemon_pid else 0.0
    cpu_before = cpu_seconds_self_and_children()
    start = time.perf_counter()
    seen = 0
    for images, _ in loader:
        seen += images.shape[0]
    seconds = time.perf_counter() - start
    del loader  # its workers exit and are reaped, so RUSAGE_CHILDREN counts them
    if seen != len(dataset):
        raise RuntimeError(f"the loader returned {seen} of {len(dataset)} images")
    return {
        "images": seen,
        "seconds": seconds,
        "images_per_s": seen / seconds,
        "loader_cpu_s": cpu_seconds_self_and_children() - cpu_before,
        "dsfs_cpu_s": (process_cpu_seconds(daemon_pid) - daemon_before) if daemon_pid else None,
    }


class Bench:
    def __init__(self, args):
        self.args = args
        self.dsfs = os.path.abspath(os.path.join(args.build, "dsfs"))
        if not os.access(self.dsfs, os.X_OK):
            sys.exit(f"no dsfs binary at {self.dsfs}; build it or pass --build")
        self.tmp = tempfile.mkdtemp(prefix="dsfs-view-loader-")
        self.shm = tempfile.mkdtemp(prefix="dsfs-view-loader-", dir="/dev/shm")
        self.env = private_env(self.tmp)
        self.mnt = os.path.join(self.tmp, "mnt")
        self.redis = None
        self.mounted = False

    def run_dsfs(self, *args):
        done = subprocess.run([self.dsfs, *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"dsfs {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")

    def start(self):
        self.redis = RedisServer(self.tmp)
        self.url = self.redis.url
        source = os.path.join(self.tmp, "src")
        classes = self.args.classes
        per_class = max(1, self.args.images // classes)
        self.run_dsfs("synth", source, "--classes", str(classes), "--per-class", str(per_class),
                      "--seed", "1")
        self.run_dsfs("ingest", source, "--dataset", DATASET, "--redis", self.url)
        self.tmpfs_copy = os.path.join(self.shm, "src")
        shutil.copytree(source, self.tmpfs_copy)
        os.makedirs(self.mnt)

    def mount(self, *extra):
        self.run_dsfs("mount", self.mnt, "--redis", self.url, "--view-backend",
                      self.args.view_backend, "--log-file", os.path.join(self.tmp, "mount.log"),
                      *extra)
        self.mounted = True
        with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
            self.backend = json.load(f)["views"]["backend"]
        pid = mount_daemon_pid(self.mnt)
        if pid is None:
            raise RuntimeError(f"no dsfs mount daemon found for {self.mnt}")
        return pid

    def umount(self):
        self.run_dsfs("umount", self.mnt)
        self.mounted = False

    def stop(self):
        if self.mounted:
            subprocess.run([self.dsfs, "umount", self.mnt], env=self.env, capture_output=True)
        if self.redis:
            self.redis.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)

    def one_run(self, seed):
        a = self.args
        result = {}
        pid = self.mount()
        views = NpyFolder(os.path.join(self.mnt, ".views", SPEC, DATASET))
        result["views_first_epoch"] = epoch(views, a.workers, a.batch, seed, pid)
        result["views_second_epoch"] = epoch(views, a.workers, a.batch, seed + 1, pid)
        with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
            result["dsfs_views_stats"] = json.load(f)["views"]
        self.umount()

        pid = self.mount()
        jpegs = torchvision.datasets.ImageFolder(os.path.join(self.mnt, DATASET), eval_transform())
        result["jpeg_via_dsfs"] = epoch(jpegs, a.workers, a.batch, seed, pid)
        self.umount()

        tmpfs = torchvision.datasets.ImageFolder(self.tmpfs_copy, eval_transform())
        result["jpeg_from_tmpfs"] = epoch(tmpfs, a.workers, a.batch, seed)

        for workers in plan_worker_counts(a.workers):
            for mode, threads in (("demand", "0"), ("ahead", "auto")):
                pid = self.mount("--view-render-ahead", threads)
                views = NpyFolder(os.path.join(self.mnt, ".views", SPEC, DATASET))
                order = torch.utils.data.RandomSampler(
                    views, generator=torch.Generator().manual_seed(seed))
                sampler = PlanSampler(order, mount=self.mnt, paths=[p for p, _ in views.samples])
                key = f"plan_{mode}_w{workers}"
                result[key] = epoch(views, workers, a.batch, seed, pid, sampler=sampler)
                with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
                    result[key]["views"] = json.load(f)["views"]
                self.umount()
        return result


def plan_worker_counts(workers):
    return sorted({1, workers})


def labels(workers):
    """Row keys and their labels, in table order."""
    rows = {
        "views_first_epoch": "views, first epoch (dsfs renders)",
        "views_second_epoch": "views, second epoch (page cache)",
        "jpeg_via_dsfs": "JPEG + torchvision transform, via dsfs",
        "jpeg_from_tmpfs": "JPEG + torchvision transform, from tmpfs",
    }
    for w in plan_worker_counts(workers):
        noun = "worker" if w == 1 else "workers"
        rows[f"plan_demand_w{w}"] = f"views + PlanSampler, rendered on read, {w} {noun}"
        rows[f"plan_ahead_w{w}"] = f"views + PlanSampler, rendered ahead, {w} {noun}"
    return rows


LABELS = {}  # set by main() from --workers


def summarize(runs):
    summary = {}
    for key in LABELS:
        rows = [run[key] for run in runs]
        summary[key] = {
            "images_per_s": statistics.median(r["images_per_s"] for r in rows),
            "loader_cpu_s": statistics.median(r["loader_cpu_s"] for r in rows),
            "dsfs_cpu_s": (statistics.median(r["dsfs_cpu_s"] for r in rows)
                           if rows[0]["dsfs_cpu_s"] is not None else None),
            "images": rows[0]["images"],
        }
        if "views" in rows[0]:  # how the view files were found, summed over runs
            reads = [r["views"]["reads"] for r in rows]
            total = sum(x["ready"] + x["joined"] + x["miss"] for x in reads)
            summary[key]["views_ready_share"] = sum(x["ready"] for x in reads) / total
            summary[key]["views_rendered_ahead"] = statistics.median(
                r["views"]["ahead"]["rendered"] for r in rows)
    baseline = summary["jpeg_from_tmpfs"]["images_per_s"]
    for key in LABELS:
        summary[key]["vs_jpeg_from_tmpfs"] = summary[key]["images_per_s"] / baseline
    return summary


def markdown(summary, backend, meta):
    lines = [f"{meta['images']} synthetic ImageNet-like JPEGs, DataLoader with {meta['workers']} "
             f"workers, batch {meta['batch']}, {meta['cpus']} cores, view backend {backend}; "
             f"median of {meta['runs']} runs.", "",
             "| loader | images/s | vs JPEG from tmpfs | loader CPU s | dsfs CPU s | CPU ms/image "
             "| views found rendered |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label in LABELS.items():
        s = summary[key]
        dsfs_cpu = s["dsfs_cpu_s"] or 0.0
        per_image = 1000 * (s["loader_cpu_s"] + dsfs_cpu) / s["images"]
        lines.append(f"| {label} | {s['images_per_s']:.0f} | {s['vs_jpeg_from_tmpfs']:.2f}x | "
                     f"{s['loader_cpu_s']:.1f} | "
                     f"{'-' if s['dsfs_cpu_s'] is None else f'{dsfs_cpu:.1f}'} | "
                     f"{per_image:.2f} | "
                     + (f"{100 * s['views_ready_share']:.0f}% |" if "views_ready_share" in s
                        else "|"))
    return "\n".join(lines)


def plot(summary, backend, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = list(LABELS)
    values = [summary[k]["images_per_s"] for k in keys]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.45 * len(keys)))
    palette = {"views_first_epoch": "#2b8cbe", "views_second_epoch": "#7bccc4",
               "jpeg_via_dsfs": "#fdae61", "jpeg_from_tmpfs": "#d7191c"}
    colors = [palette.get(k, "#756bb1" if "ahead" in k else "#bcbddc") for k in keys]
    bars = ax.barh([LABELS[k] for k in keys], values, color=colors)
    ax.invert_yaxis()
    for bar, value in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.0f}",
                va="center")
    ax.set_xlabel("images/s (median)")
    ax.set_title(f"DataLoader ({meta['workers']} workers unless stated), {meta['images']} images, "
                 f"{meta['cpus']} cores:\n.npy from .views/{SPEC} ({backend}) vs JPEG + "
                 "torchvision", fontsize=10)
    ax.set_xlim(0, max(values) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                    help="build directory with the dsfs binary (default: ../build)")
    ap.add_argument("--images", type=int, default=2000, help="images to synthesize (default 2000)")
    ap.add_argument("--classes", type=int, default=20, help="class folders (default 20)")
    ap.add_argument("--runs", type=int, default=3, help="runs; medians are reported (default 3)")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--view-backend", default="auto", choices=["auto", "cuda", "cpu"],
                    help="dsfs mount --view-backend (default auto)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "view_loader"),
                    help="output path without extension (default bench/results/view_loader)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    LABELS.update(labels(args.workers))
    # More workers than cores is the point of the comparison, not a mistake to warn about.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    with open("/proc/loadavg") as f:
        load_before = [float(x) for x in f.read().split()[:3]]
    bench = Bench(args)
    runs = []
    try:
        bench.start()
        for run in range(args.runs):
            runs.append(bench.one_run(seed=run))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(
                f"{k} {runs[-1][k]['images_per_s']:.0f}/s" for k in LABELS), flush=True)
        backend = bench.backend
    finally:
        bench.stop()

    summary = summarize(runs)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    meta = {"images": summary["jpeg_from_tmpfs"]["images"], "workers": args.workers,
            "batch": args.batch, "runs": args.runs, "cpus": os.cpu_count()}
    result = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "loadavg_before": load_before, "loadavg_after": [float(x) for x in load]},
        "settings": {**meta, "spec": SPEC, "view_backend": backend,
                     "torch": torch.__version__, "torchvision": torchvision.__version__},
        "summary": summary,
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    plot(summary, backend, meta, args.out + ".png")
    print()
    print(markdown(summary, backend, meta))
    print(f"\nwrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
