#!/usr/bin/python3
"""Where one first epoch spends its time: `.dsfs/stats.json` sampled every 0.1 s while
`dsfs bench` reads one epoch, printed as one line per sample (issue 17).

    bench/epoch_timeline.py [--build build] [--rtt 100] [--files 10000] [--mode plan|auto]

With `first_epoch.py`'s set-up (its `Bench`): the same dataset under --data-dir (kept), ingested
into a private redis-server on a unix socket, `dsfs proxy --rtt` in front of it (none at 0); mounts
with a cache that holds the data, and reads one epoch with `dsfs bench --pattern epochs --jobs 8
--drop-caches` (`--plan` in plan mode). Each line: seconds since sampling began, reads so far and
since the last line, reads that joined a fetch in flight or missed, reader stall seconds added
(all readers together), GETs sent, fetches in flight and held, the window's target, the base
round trip, the burst rate, the fetches sent with the plan's window open, and the daemon's
three busiest threads over the interval (name and share of one CPU). Writes the samples
to --out (JSON). Needs root (mount, drop_caches). A diagnostic, not a side-by-side benchmark:
its figures go in docs/benchmarks.md only as observations.
"""
import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import mount_daemon_pid, process_usage, run, thread_cpu_used  # noqa: E402
from first_epoch import Bench  # noqa: E402


def sample_loop(bench, pid, samples, stop):
    start = time.perf_counter()
    while not stop.is_set():
        threads = process_usage(pid)["threads"]
        samples.append((time.perf_counter() - start, bench.stats()["prefetch"], threads))
        stop.wait(0.1)


def busiest_threads(threads, previous, seconds, count=3):
    """The `count` threads that used the most CPU since `previous`: "name share" each."""
    return " ".join(f"{name} {cpu / seconds:.0%}"
                    for cpu, name in thread_cpu_used(previous, threads)[:count] if cpu > 0)


def print_samples(samples):
    previous = None
    previous_t, previous_threads = 0.0, {}
    for t, p, threads in samples:
        reads, inflight = p["reads"], p["inflight"]
        now = (p["accesses"], reads["joined"], reads["miss"], p["stall_us"]["total_s"], p["gets"])
        d = [a - b for a, b in zip(now, previous or now)]
        previous = now
        print(f"{t:5.2f}s reads {now[0]:6d} +{d[0]:5d} joined +{d[1]:4d} miss +{d[2]:3d} "
              f"stall +{d[3]:5.2f}s gets +{d[4]:5d} in flight {inflight['objects']:5d} "
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
    p.add_argument("--out", default=None,
                   help="JSON of the samples (default: /tmp/epoch_timeline-MODE-RTTms.json)")
    args = p.parse_args()
    # first_epoch.py's set-up: the same dataset (kept for the next run), Redis, proxy, mount.
    bench = Bench(argparse.Namespace(builds=[args.build], labels=["timeline"], files=args.files,
                                     data_dir=args.data_dir, keep_data=True, epoch_seconds=600,
                                     name="epoch_timeline", results_dir=None))
    dsfs = bench.dsfs
    samples, stop = [], threading.Event()
    sampler = None
    try:
        bench.start()
        url = bench.url_for(args.rtt)
        run([dsfs, "mount", bench.mnt, "--redis", url, "--dataset", "bench", "--prefetch", "auto",
             "--cache-size", bench.dataset["bytes"], "--timeout", "120s"], env=bench.env)
        sampler = threading.Thread(target=sample_loop,
                                   args=(bench, mount_daemon_pid(bench.mnt), samples, stop))
        sampler.start()
        result = os.path.join(bench.workdir, "bench.json")
        run([dsfs, "bench", os.path.join(bench.mnt, "bench"), "--pattern", "epochs", "--jobs", 8,
             "--epochs", 1, "--seed", 1000, "--drop-caches", "--json", result,
             *(["--plan"] if args.mode == "plan" else [])], timeout=600)
        with open(result) as f:
            epoch = json.load(f)["epochs"][0]
    finally:
        stop.set()
        if sampler and sampler.is_alive():
            sampler.join()
        bench.close()
    print_samples(samples)
    print(f"epoch: {epoch['files_per_s']:.0f} files/s over {epoch['seconds']:.2f} s "
          f"({args.mode}, {args.rtt} ms, {args.files} files)")
    out = args.out or f"/tmp/epoch_timeline-{args.mode}-{args.rtt}ms.json"
    with open(out, "w") as f:
        json.dump({"rtt_ms": args.rtt, "mode": args.mode, "files": args.files,
                   "epoch": epoch, "samples": samples}, f)
    print(f"samples: {out}")


if __name__ == "__main__":
    main()
