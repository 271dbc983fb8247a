#!/usr/bin/env python3
"""The filesystem layer's benchmark (issue 14): what a warm read and a huge folder cost through
dsfs against tmpfs, side by side in one run, with the FUSE requests each one sends.

Warm reads: an ImageNet-like synthetic dataset, read in shuffled order by 8 threads of a plain
Python loader (`open(p, "rb").read()`: open, fstat, read to EOF, close, as PIL and most loaders
do), the same with `buffering=0`, and `dsfs bench --jobs 8` (C: open, read, close). Pass 0 is the
first read after the mount (cold for dsfs, warm for tmpfs); passes 1.. are warm. FUSE requests
per file come from the mount's stats.json (every request kind, ioctl and flush included).

Browsing: one folder of --entries small files: `ls -l` (first listing after the mount, then
again), `find -ls`, `du -s` and `stat` of every entry, timed on tmpfs and dsfs.

`--baseline DSFS` runs the dsfs cases again with another dsfs binary (an older build) for a
before/after comparison in the same run. Writes results/fs_layer.{json,png} and the generated
section of docs/benchmarks.md (unless --no-docs). Needs root (mounts); about 3 minutes.

    bench/fs_layer.py --build build [--baseline /path/to/old/dsfs]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from common import (REPO, RedisServer, log, machine_info, median, private_env, run,
                    synth_dataset, update_docs_section)

DOCS_START = "<!-- fs_layer.py: start -->"
DOCS_END = "<!-- fs_layer.py: end -->"
DOCS_HEADING = "## The filesystem layer: warm reads and huge folders (issue 14)"
THREADS = 8

# A fresh interpreter per pass, so no Python-level cache carries over; prints files/s.
PY_READER = r"""
import os, random, sys, threading, time
files = [l for l in sys.stdin.read().split("\n") if l]
seed, buffering = int(sys.argv[1]), int(sys.argv[2])
random.Random(seed).shuffle(files)
errors = []
def reader(part):
    try:
        for p in part:
            with open(p, "rb", buffering=buffering) as f:
                f.read()
    except OSError as e:
        errors.append(e)
threads = [threading.Thread(target=reader, args=(files[i::%d],)) for i in range(%d)]
start = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.perf_counter() - start
if errors: sys.exit(f"read failed: {errors[0]}")
print(len(files) / elapsed)
""" % (THREADS, THREADS)


def run_with_input(args, text):
    res = subprocess.run([str(a) for a in args], input=text, text=True, capture_output=True,
                         timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"command failed ({res.returncode}): {args}\n{res.stderr}")
    return res.stdout


def list_files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names]
    out.sort()
    return out


def read_stats(mount):
    # buffering=0: no isatty() ioctl, so reading the counters adds no ioctl to them.
    with open(os.path.join(mount, ".dsfs", "stats.json"), "rb", buffering=0) as f:
        return json.loads(f.read())["requests"]


def requests_delta(before, after):
    """Requests between two stats.json reads; FORGET left out (one-way: the kernel drops
    inodes when it likes and waits for no answer)."""
    return {k: after[k] - before.get(k, 0) for k in after
            if k != "forget" and after[k] != before.get(k, 0)}


class Target:
    """Where a case reads: tmpfs (the source trees) or a dsfs mount of the same datasets."""

    def __init__(self, name, images, flat, dsfs=None, url=None, env=None, workdir=None):
        self.name, self.dsfs, self.url, self.env = name, dsfs, url, env
        self.mount = None
        if dsfs:
            self.mount = os.path.join(workdir, f"mnt-{name}")
            os.makedirs(self.mount, exist_ok=True)
            run([dsfs, "mount", "--redis", url, self.mount, "--dataset", "images",
                 "--dataset", "flat"], env=env)
            self.images = os.path.join(self.mount, "images")
            self.flat = os.path.join(self.mount, "flat", "flat")
        else:
            self.images, self.flat = images, os.path.join(flat, "flat")

    def stats(self):
        return read_stats(self.mount) if self.mount else {}

    def overhead(self):
        """What reading stats.json twice costs by itself (subtracted from every figure)."""
        if not self.mount:
            return {}
        if not hasattr(self, "_overhead"):
            self.stats()  # the mount's first open and close (OPEN, FLUSH answered ENOSYS once)
            first = self.stats()
            self._overhead = requests_delta(first, self.stats())
        return self._overhead

    def close(self):
        if self.mount:
            run([self.dsfs, "umount", self.mount], env=self.env, check=False)


def timed(target, files, action):
    """Runs action() -> files/s (or None to time it here); returns (rate or seconds, requests)."""
    before = target.stats()
    start = time.perf_counter()
    value = action()
    elapsed = time.perf_counter() - start
    after = target.stats()
    sent = requests_delta(before, after)
    for kind, n in target.overhead().items():
        sent[kind] = sent.get(kind, 0) - n
    return (value if value is not None else elapsed), {k: n for k, n in sent.items() if n}


def per_file(requests, files):
    return {k: round(v / files, 4) for k, v in requests.items()}


def measure_reads(target, files, passes):
    listing = "\n".join(list_files(target.images))
    results = {}
    readers = {
        "python": lambda seed: float(
            run_with_input([sys.executable, "-c", PY_READER, seed, -1], listing)),
        "python_unbuffered": lambda seed: float(
            run_with_input([sys.executable, "-c", PY_READER, seed, 0], listing)),
        "c_bench": lambda seed: c_bench(target, seed),
    }
    for reader, action in readers.items():
        runs = []
        for p in range(passes + 1):
            rate, requests = timed(target, files, lambda: action(p))
            total = sum(requests.values())
            runs.append({"pass": p, "files_per_s": rate, "requests": requests,
                         "requests_per_file": round(total / files, 4),
                         "by_kind_per_file": per_file(requests, files)})
            log(f"{target.name} {reader} pass {p}: {rate:.0f} files/s, "
                f"{total / files:.3f} FUSE requests/file {requests}")
        warm = [r for r in runs if r["pass"] >= 2] or runs[-1:]
        results[reader] = {"passes": runs,
                           "warm_files_per_s": median([r["files_per_s"] for r in warm]),
                           "warm_requests_per_file": median([r["requests_per_file"] for r in warm])}
    return results


def c_bench(target, seed):
    dsfs = target.dsfs or BUILD_DSFS
    res = run([dsfs, "bench", target.images, "--pattern", "shuffle", "--seed", seed, "--jobs",
               THREADS, "--json", "-"], env=target.env)
    return json.loads(res.stdout)["totals"]["files_per_s"]


def measure_browse(target, entries):
    flat = target.flat
    commands = [
        ("ls -l (first)", ["ls", "-l", flat]),
        ("ls -l (again)", ["ls", "-l", flat]),
        ("find -ls", ["find", flat, "-ls"]),
        ("du -s", ["du", "-s", flat]),
        ("stat", ["sh", "-c", 'cd "$1" && exec stat -- * >/dev/null', "sh", flat]),
    ]
    results = {}
    for label, argv in commands:
        seconds, requests = timed(target, entries, lambda: subprocess.run(
            argv, stdout=subprocess.DEVNULL, check=True, timeout=600) and None)
        results[label] = {"seconds": seconds, "requests": requests,
                          "requests_per_entry": round(sum(requests.values()) / entries, 4)}
        log(f"{target.name} {label}: {seconds:.3f} s, {requests}")
    return results


def make_flat(root, entries):
    """One folder of `entries` small files (100-999 bytes), reused when complete."""
    marker = os.path.join(root, ".complete")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(os.path.join(root, "flat"))
        rng = random.Random(1)
        for i in range(entries):
            with open(os.path.join(root, "flat", f"f{i:07d}.bin"), "wb") as f:
                f.write(rng.randbytes(100 + i % 900))
        open(marker, "w").close()
    return root


def plot(results, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    targets = list(results["targets"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    readers = ["python", "python_unbuffered", "c_bench"]
    width = 0.8 / len(targets)
    for i, t in enumerate(targets):
        ax1.bar([x + i * width for x in range(len(readers))],
                [results["targets"][t]["reads"][r]["warm_files_per_s"] for r in readers],
                width, label=t)
    ax1.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(readers))], readers)
    ax1.set_ylabel("warm files/s (median)")
    ax1.set_title(f"warm reads, {results['images']['files']} files, {THREADS} threads")
    ax1.legend()
    labels = list(results["targets"][targets[0]]["browse"])
    for i, t in enumerate(targets):
        ax2.bar([x + i * width for x in range(len(labels))],
                [results["targets"][t]["browse"][c]["seconds"] for c in labels], width, label=t)
    ax2.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(labels))], labels,
                   rotation=15)
    ax2.set_ylabel("seconds")
    ax2.set_title(f"one folder of {results['entries']} entries")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=110)


def markdown(results):
    t = results["targets"]
    tmpfs = t["tmpfs"]
    lines = [DOCS_START, "",
             f"Generated by `bench/fs_layer.py` on {results['machine']['date']} "
             f"({results['machine']['cpus']} CPUs, kernel {results['machine']['kernel']}). "
             f"{results['images']['files']} files of about "
             f"{results['images']['mean_file_bytes'] // 1000} KB read by {THREADS} threads in "
             "shuffled order; pass 0 is the first read after the mount, the figure is the "
             "median of passes 2 and later. FUSE requests counted by the mount, every kind.", "",
             "| reader | " + " | ".join(f"{n} files/s" for n in t) + " | " +
             " | ".join(f"{n} vs tmpfs" for n in t if n != "tmpfs") + " | " +
             " | ".join(f"{n} requests/file" for n in t if n != "tmpfs") + " |",
             "|---|" + "---:|" * (len(t) + 2 * (len(t) - 1))]
    for reader in ["python", "python_unbuffered", "c_bench"]:
        base = tmpfs["reads"][reader]["warm_files_per_s"]
        row = [reader] + [f"{t[n]['reads'][reader]['warm_files_per_s']:.0f}" for n in t]
        row += [f"{t[n]['reads'][reader]['warm_files_per_s'] / base:.2f}" for n in t if n != "tmpfs"]
        row += [f"{t[n]['reads'][reader]['warm_requests_per_file']:.3f}" for n in t if n != "tmpfs"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"One folder of {results['entries']} entries (seconds; requests per entry):", "",
              "| command | " + " | ".join(t) + " | " +
              " | ".join(f"{n} vs tmpfs" for n in t if n != "tmpfs") + " |",
              "|---|" + "---:|" * (2 * len(t) - 1)]
    for label in tmpfs["browse"]:
        base = tmpfs["browse"][label]["seconds"]
        row = [label]
        for n in t:
            b = t[n]["browse"][label]
            row.append(f"{b['seconds']:.2f}" if n == "tmpfs"
                       else f"{b['seconds']:.2f} ({b['requests_per_entry']:.4f})")
        row += [f"{t[n]['browse'][label]['seconds'] / base:.1f}x" for n in t if n != "tmpfs"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "![fs layer](../bench/results/fs_layer.png)", "", DOCS_END]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--baseline", help="another dsfs binary to compare (e.g. an older build)")
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--entries", type=int, default=50000)
    parser.add_argument("--passes", type=int, default=4, help="warm passes after pass 0")
    parser.add_argument("--workdir", default="/dev/shm/dsfs-bench-fs")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    global BUILD_DSFS
    BUILD_DSFS = os.path.abspath(os.path.join(args.build, "dsfs"))
    os.makedirs(args.workdir, exist_ok=True)
    work = tempfile.mkdtemp(dir=args.workdir, prefix="run-")
    env = private_env(work)
    redis = RedisServer(work)
    targets = []
    try:
        images, _ = synth_dataset(BUILD_DSFS, args.workdir, args.files)
        flat = make_flat(os.path.join(args.workdir, f"flat-{args.entries}"), args.entries)
        for name, src in (("images", images), ("flat", flat)):
            run([BUILD_DSFS, "ingest", "--redis", redis.url, src, "--dataset", name], env=env)
        files = len(list_files(images))
        results = {"machine": machine_info(), "threads": THREADS, "entries": args.entries,
                   "images": {"files": files,
                              "mean_file_bytes": sum(os.path.getsize(p) for p in
                                                     list_files(images)) // files},
                   "targets": {}}
        cases = [("tmpfs", None)] + ([("dsfs-before", os.path.abspath(args.baseline))]
                                     if args.baseline else []) + [("dsfs", BUILD_DSFS)]
        for name, dsfs in cases:
            target = Target(name, images, flat, dsfs, redis.url, env, work)
            targets.append(target)
            target.overhead()
            try:
                # Browsing first: its first `ls -l` is the first listing since the mount.
                browse = measure_browse(target, args.entries)
                reads = measure_reads(target, files, args.passes)
            finally:
                target.close()
                targets.remove(target)
            results["targets"][name] = {"binary": dsfs, "reads": reads, "browse": browse}
        out = os.path.join(REPO, "bench", "results", "fs_layer")
        with open(out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        plot(results, out)
        text = markdown(results)
        print(text)
        if not args.no_docs:
            update_docs_section(DOCS_START, DOCS_END, DOCS_HEADING, text)
    finally:
        for target in targets:
            target.close()
        redis.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
