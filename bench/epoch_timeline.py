#!/usr/bin/python3
"""Where an epoch spends its time: `.dsfs/stats.json` sampled every 0.1 s while `dsfs bench`
reads one epoch (or --epochs N, one after the other on the same mount), printed as one line per
sample (issues 17 and 13).

    bench/epoch_timeline.py [--build build] [--rtt 100] [--files 10000] [--mode plan|auto]
                            [--epochs 1] [--cache-fraction 1.0]
                            [--disk-cache [--tier-fraction 1.0] [--disk-dir /var/tmp]]

With `first_epoch.py`'s set-up (its `Bench`): the same dataset under --data-dir (kept), ingested
into a private redis-server on a unix socket, `dsfs proxy --rtt` in front of it (none at 0); mounts
with a cache that holds the data, and reads one epoch with `dsfs bench --pattern epochs --jobs 8
--drop-caches` (`--plan` in plan mode). Each line: seconds since sampling began, reads so far and
since the last line, reads that joined a fetch in flight or missed, reader stall seconds added
(all readers together), GETs sent, fetches in flight and held, the window's target, the base
round trip, the burst rate, the fetches sent with the plan's window open, and the daemon's
three busiest threads over the interval (name and share of one CPU). With --disk-cache (a tier
under --disk-dir sized as bench/disk_tier.py sizes it, --tier-fraction of the whole dataset;
use --cache-fraction 0.25 for that benchmark's memory cache) also: files staged from the tier,
tier writes, objects deferred and dropped, files queued for the stagers. Writes the samples
to --out (JSON). Needs root (mount, drop_caches). A diagnostic, not a side-by-side benchmark:
its figures go in docs/benchmarks.md only as observations.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (disk_tier_bytes, mount_daemon_pid, process_usage, run,  # noqa: E402
                    thread_cpu_used)
from first_epoch import Bench  # noqa: E402


def sample_loop(bench, pid, samples, stop):
    start = time.perf_counter()
    while not stop.is_set():
        threads = process_usage(pid)["threads"]
        stats = bench.stats()
        samples.append((time.perf_counter() - start, stats["prefetch"], threads,
                        stats.get("disk_tier")))
        stop.wait(0.1)


def busiest_threads(threads, previous, seconds, count=3):
    """The `count` threads that used the most CPU since `previous`: "name share" each."""
    return " ".join(f"{name} {cpu / seconds:.0%}"
                    for cpu, name in thread_cpu_used(previous, threads)[:count] if cpu > 0)


def print_samples(samples):
    previous = None
    previous_t, previous_threads = 0.0, {}
    for t, p, threads, tier in samples:
        reads, inflight = p["reads"], p["inflight"]
        now = (p["accesses"], reads["joined"], reads["miss"], p["stall_us"]["total_s"], p["gets"],
               p.get("disk_reads", 0), (tier or {}).get("writes", 0))
        d = [a - b for a, b in zip(now, previous or now)]
        previous = now
        disk = ""
        if tier is not None:
            disk = (f"staged +{d[5]:5d} writes +{d[6]:5d} deferred {tier['writes_deferred']} "
                    f"dropped {tier['writes_dropped']} stagers' queue "
                    f"{p['disk_staging']['objects']:4d} ")
        print(f"{t:5.2f}s reads {now[0]:6d} +{d[0]:5d} joined +{d[1]:4d} miss +{d[2]:3d} "
              f"stall +{d[3]:5.2f}s gets +{d[4]:5d} {disk}in flight {inflight['objects']:5d} "
              f"held {inflight['held']:4d} target {inflight['target']:5d} "
              f"base rtt {inflight['base_rtt_ms']:.0f} ms burst {inflight['burst_per_s']:.0f}/s "
              f"opened {inflight['fetches_opened_for_plan']} | "
              f"{busiest_threads(threads, previous_threads, max(t - previous_t, 1e-3))}")
        previous_t, previous_threads = t, threads


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build", help="build folder holding dsfs")
    p.add_argument("--rtt", type=int, default=100, help="ms; 0: the server's own socket")
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--mode", choices=["plan", "auto"], default="plan")
    p.add_argument("--data-dir", default="/dev/shm/dsfs-bench-data")
    p.add_argument("--epochs", type=int, default=1,
                   help="epochs read one after the other on the same mount (1)")
    p.add_argument("--cache-fraction", type=float, default=1.0,
                   help="--cache-size as a fraction of the dataset (1.0: it holds the data)")
    p.add_argument("--disk-cache", action="store_true",
                   help="mount with a disk tier (--disk-cache) under --disk-dir")
    p.add_argument("--tier-fraction", type=float, default=1.0,
                   help="the tier's size as a fraction of what holds the whole dataset (1.0)")
    p.add_argument("--disk-dir", default="/var/tmp",
                   help="where the tier goes (the machine's disk, not tmpfs)")
    p.add_argument("--out", default=None,
                   help="JSON of the samples (default: /tmp/epoch_timeline-MODE-RTTms.json)")
    args = p.parse_args()
    # first_epoch.py's set-up: the same dataset (kept for the next run), Redis, proxy, mount.
    bench = Bench(argparse.Namespace(builds=[args.build], labels=["timeline"], files=args.files,
                                     data_dir=args.data_dir, keep_data=True, epoch_seconds=600,
                                     name="epoch_timeline", results_dir=None))
    dsfs = bench.dsfs
    epochs = []
    tier_dir = None
    try:
        bench.start()
        url = bench.url_for(args.rtt)
        mount = [dsfs, "mount", bench.mnt, "--redis", url, "--dataset", "bench", "--prefetch",
                 "auto", "--cache-size", max(1 << 20, int(bench.dataset["bytes"] *
                                                        args.cache_fraction)),
                 "--timeout", "120s"]
        if args.disk_cache:
            tier_dir = tempfile.mkdtemp(prefix="dsfs-timeline-tier-", dir=args.disk_dir)
            mount += ["--disk-cache", tier_dir, "--disk-cache-size",
                      disk_tier_bytes(bench.dataset, args.tier_fraction)]
        run(mount, env=bench.env)
        pid = mount_daemon_pid(bench.mnt)
        for e in range(args.epochs):
            samples, stop = [], threading.Event()
            sampler = threading.Thread(target=sample_loop, args=(bench, pid, samples, stop))
            sampler.start()
            try:
                result = os.path.join(bench.workdir, "bench.json")
                run([dsfs, "bench", os.path.join(bench.mnt, "bench"), "--pattern", "epochs",
                     "--jobs", 8, "--epochs", 1, "--seed", 1000 + e, "--drop-caches", "--json",
                     result, *(["--plan"] if args.mode == "plan" else [])], timeout=600)
            finally:
                stop.set()
                sampler.join()
            with open(result) as f:
                epochs.append({"epoch": json.load(f)["epochs"][0], "samples": samples})
    finally:
        bench.close()
        if tier_dir:
            shutil.rmtree(tier_dir, ignore_errors=True)
    for number, e in enumerate(epochs, 1):
        print(f"epoch {number}:")
        print_samples(e["samples"])
        print(f"epoch {number}: {e['epoch']['files_per_s']:.0f} files/s over "
              f"{e['epoch']['seconds']:.2f} s ({args.mode}, {args.rtt} ms, {args.files} files"
              f"{', disk tier' if args.disk_cache else ''})")
    out = args.out or f"/tmp/epoch_timeline-{args.mode}-{args.rtt}ms.json"
    with open(out, "w") as f:
        json.dump({"rtt_ms": args.rtt, "mode": args.mode, "files": args.files,
                   "cache_fraction": args.cache_fraction, "disk_cache": args.disk_cache,
                   "tier_fraction": args.tier_fraction if args.disk_cache else None,
                   "epochs": epochs}, f)
    print(f"samples: {out}")


if __name__ == "__main__":
    main()
