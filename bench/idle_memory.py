#!/usr/bin/env python3
"""What the mount daemon's memory does after an epoch: its RSS while a Python loader reads one
shuffled epoch (8 threads: open, fstat, read to EOF, close) and for a while after the reads
stop, with a RAM cache smaller than the data (and optionally a disk tier), for one or more
builds side by side in one run (interleaved, alternating order). Shows what the daemon keeps of
the memory it freed, and what it gives back once reads pause (stats.json `memory`).

    bench/idle_memory.py [--builds build[,build-before]] [--labels after,before] [--files N]
        [--runs N] [--idle-seconds S] [--disk-tier] [--second-epoch] [--data-dir DIR]
        [--keep-data] [--name N]

Results: bench/results/NAME.json and NAME.png (RSS over time, run 1 of each build). Root (it
mounts and drops the page cache)."""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, RedisServer, disk_tier_bytes, drop_caches, find_builds,  # noqa: E402
                    ingest, load_average, log, machine_info, make_workdir, median,
                    mount_daemon_pid, prepare_dataset, process_usage, relative_paths,
                    require_root, run, save_results, split_builds)

READERS = 8
CACHE_FRACTION = 0.25
SAMPLE_S = 0.1


def read_epoch(root, paths, seed):
    """One shuffled epoch of `paths` under `root` by READERS threads; returns (files, seconds)."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    lock = threading.Lock()
    errors = []

    def reader():
        while True:
            with lock:
                if not order:
                    return
                path = order.pop()
            try:
                with open(os.path.join(root, path), "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    got = 0
                    while True:
                        chunk = f.read(1 << 20)
                        if not chunk:
                            break
                        got += len(chunk)
                if got != size:
                    raise OSError(f"{path}: read {got} of {size} bytes")
            except OSError as e:
                with lock:
                    errors.append(str(e))
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"read errors: {errors[:3]}")
    return len(paths), time.perf_counter() - t0


class Sampler:
    """VmRSS of `pid` every SAMPLE_S seconds in a thread, as (seconds since start, bytes)."""

    def __init__(self, pid):
        self.pid = pid
        self.samples = []
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)
        self.thread.start()

    def loop(self):
        while not self.stop.is_set():
            try:
                rss = process_usage(self.pid)["rss_bytes"]
            except OSError:
                return
            self.samples.append((time.perf_counter() - self.t0, rss))
            self.stop.wait(SAMPLE_S)

    def now(self):
        return time.perf_counter() - self.t0

    def close(self):
        self.stop.set()
        self.thread.join()


class Bench:
    def __init__(self, args):
        self.args = args
        self.builds = find_builds(args.builds, args.labels)
        self.dsfs = self.builds[args.labels[0]]["dsfs"]
        self.workdir, self.env, self.mnt = make_workdir("dsfs-idle-memory-")
        self.redis = None
        self.created_data = None
        self.results = {"machine": machine_info(), "config": vars(args).copy(),
                        "builds": {k: v["source"] for k, v in self.builds.items()},
                        "load_average": {"start": load_average()}, "cases": []}

    def start(self):
        data = prepare_dataset(self)
        self.paths = relative_paths(data)
        self.redis = RedisServer(self.workdir)
        log(f"ingesting {data}")
        ingest(self.dsfs, data, self.redis.url, self.env)

    def close(self):
        self.umount()
        if self.redis:
            self.redis.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.created_data:
            shutil.rmtree(self.created_data, ignore_errors=True)

    def umount(self):
        if os.path.ismount(self.mnt):
            run([self.dsfs, "umount", self.mnt], env=self.env, check=False)
            if os.path.ismount(self.mnt):
                run(["umount", "-l", self.mnt], check=False)

    def stats(self):
        with open(os.path.join(self.mnt, ".dsfs", "stats.json"), "rb", buffering=0) as f:
            return json.loads(f.read())

    def case(self, label, run_index):
        a = self.args
        cache = max(1 << 20, int(self.dataset["bytes"] * CACHE_FRACTION))
        args = [self.builds[label]["dsfs"], "mount", self.mnt, "--redis", self.redis.url,
                "--dataset", "bench", "--prefetch", "auto", "--cache-size", cache]
        tier_dir = None
        if a.disk_tier:
            tier_dir = tempfile.mkdtemp(prefix="tier-", dir=self.workdir)
            args += ["--disk-cache", tier_dir, "--disk-cache-size",
                     disk_tier_bytes(self.dataset, 0.5)]
        drop_caches()
        run(args, env=self.env)
        sampler = None
        try:
            sampler = Sampler(mount_daemon_pid(self.mnt))
            files, seconds = read_epoch(os.path.join(self.mnt, "bench"), self.paths,
                                        seed=run_index)
            epoch_end = sampler.now()
            time.sleep(a.idle_seconds)  # the pause being measured
            memory = self.stats().get("memory", {})
            pause_end = sampler.now()
            second = None
            if a.second_epoch:  # what the next epoch pays for memory given back in the pause
                drop_caches()  # or the kernel's page cache would serve it
                second = read_epoch(os.path.join(self.mnt, "bench"), self.paths,
                                    seed=run_index + 1000)
            sampler.close()
        finally:
            if sampler:
                sampler.close()
            self.umount()
            if tier_dir:
                shutil.rmtree(tier_dir, ignore_errors=True)
        during = [rss for t, rss in sampler.samples if t <= epoch_end]
        after = [rss for t, rss in sampler.samples if epoch_end < t <= pause_end]
        result = {"build": label, "run": run_index, "files": files, "seconds": seconds,
                  "files_per_s": files / seconds, "cache_bytes": cache,
                  "peak_rss_bytes": max(during + after),
                  "rss_at_epoch_end_bytes": during[-1] if during else None,
                  "rss_after_idle_bytes": after[-1] if after else None,
                  "trims": memory.get("trims"), "released_bytes": memory.get("released_bytes"),
                  "samples": [(round(t, 2), rss) for t, rss in sampler.samples],
                  "epoch_end_s": epoch_end,
                  "second_epoch_files_per_s": second[0] / second[1] if second else None}
        mib = 1 << 20
        log(f"{label}, run {run_index}: {result['files_per_s']:.0f} files/s; RSS peak "
            f"{result['peak_rss_bytes'] / mib:.0f} MiB, at the epoch's end "
            f"{(result['rss_at_epoch_end_bytes'] or 0) / mib:.0f}, after {a.idle_seconds} s idle "
            f"{(result['rss_after_idle_bytes'] or 0) / mib:.0f} (cache {cache / mib:.0f}); "
            f"trims {result['trims']}, released {(result['released_bytes'] or 0) / mib:.0f} MiB"
            + (f"; the next epoch {result['second_epoch_files_per_s']:.0f} files/s" if second
               else ""))
        return result

    def run(self):
        labels = list(self.builds)
        for r in range(1, self.args.runs + 1):
            for label in (labels[::-1] if r % 2 == 0 else labels):
                self.results["cases"].append(self.case(label, r))
        self.results["load_average"]["end"] = load_average()
        summary = {}
        for label in labels:
            cases = [c for c in self.results["cases"] if c["build"] == label]
            summary[label] = {
                key: median([c[key] for c in cases if c[key] is not None])
                for key in ("files_per_s", "peak_rss_bytes", "rss_at_epoch_end_bytes",
                            "rss_after_idle_bytes", "released_bytes",
                            "second_epoch_files_per_s")}
        self.results["summary"] = summary
        return summary


def plot(results, path):
    try:
        import matplotlib
    except ImportError:
        log(f"no matplotlib in {sys.executable}: {path} not written")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for case in results["cases"]:
        if case["run"] != 1:
            continue
        ts = [t for t, _ in case["samples"]]
        ax.plot(ts, [rss / 2**20 for _, rss in case["samples"]], label=case["build"])
        ax.axvline(case["epoch_end_s"], linestyle=":", color="grey")
    cache = results["cases"][0]["cache_bytes"] / 2**20
    ax.axhline(cache, linestyle="--", color="black", label=f"--cache-size ({cache:.0f} MiB)")
    ax.set_xlabel("seconds since the mount (dotted: the epoch's end)")
    ax.set_ylabel("daemon RSS (MiB)")
    ax.set_title(f"{results['dataset']['files']} files, one epoch then idle"
                 f"{', disk tier' if results['config']['disk_tier'] else ''}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--builds", default="build", help="build directories, comma-separated")
    p.add_argument("--labels", help="a name per build (default: the directories' names)")
    p.add_argument("--files", type=int, default=10000, help="synthetic files (10000)")
    p.add_argument("--runs", type=int, default=3, help="runs per build (3)")
    p.add_argument("--idle-seconds", type=float, default=8,
                   help="seconds sampled after the epoch's last read (8)")
    p.add_argument("--disk-tier", action="store_true",
                   help="mount with a disk tier of half the data's size too")
    p.add_argument("--second-epoch", action="store_true",
                   help="after the pause, read one more shuffled epoch (page cache dropped) on "
                        "the same mount: what memory given back costs the next epoch")
    p.add_argument("--data-dir", default="/dev/shm/dsfs-bench-data",
                   help="where the synthetic dataset is made (tmpfs)")
    p.add_argument("--keep-data", action="store_true", help="keep the synthetic dataset")
    p.add_argument("--name", default="idle_memory", help="results file name")
    args = p.parse_args()
    args.builds, args.labels = split_builds(args.builds, args.labels,
                                            "bench: --labels needs one distinct name per build")
    require_root()
    bench = Bench(args)
    try:
        bench.start()
        summary = bench.run()
    finally:
        bench.close()
    save_results(bench.results, os.path.join(REPO, "bench", "results"), args.name)
    out = os.path.join(REPO, "bench", "results", args.name)
    plot(bench.results, out + ".png")
    for label, s in summary.items():
        log(f"{label}: median {s['files_per_s']:.0f} files/s; RSS peak "
            f"{s['peak_rss_bytes'] / 2**20:.0f} MiB, epoch end "
            f"{s['rss_at_epoch_end_bytes'] / 2**20:.0f}, after idle "
            f"{s['rss_after_idle_bytes'] / 2**20:.0f}")
    log(f"results: {out}.json, {out}.png")


if __name__ == "__main__":
    main()
