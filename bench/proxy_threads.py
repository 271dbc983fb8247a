#!/usr/bin/python3
"""What `dsfs proxy --threads N` carries: raw pipelined GETs (`dsfs_bench_redis_raw`, no FUSE)
through the proxy at one RTT, for each thread count in turn, the same Redis and data.

    bench/proxy_threads.py [--build build] [--threads 1,2,4] [--rtt 100] [--files 3000]
                           [--rounds 3] [--jobs 8] [--pipeline 256] [--direct-shapes 8x4,8x256]

Synthesizes (or reuses) a dataset under --data-dir, ingests it into a private redis-server on a
unix socket, then per round and thread count starts `dsfs proxy --rtt --threads N` in front of
it and reads one shuffled epoch with --jobs connections of --pipeline GETs each (enough in
flight that the round trip does not bound it: jobs x pipeline / RTT files/s). Thread counts
alternate in order from round to round. With --direct-shapes, each round first reads an epoch
straight from Redis (no proxy) with each JOBSxPIPELINE given: what Redis itself serves with that
many GETs outstanding, beside what it serves through the proxy. Writes bench/results/NAME.json and
NAME.png (files/s, the proxy's CPU and page faults per file, Redis's CPU per file; medians of the
rounds). Needs redis-server; no root.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, Proxy, RedisServer, log, machine_info, median, private_env,  # noqa: E402
                    process_usage, run, synth_dataset)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--threads", default="1,2,4")
    p.add_argument("--rtt", type=int, default=100, help="ms")
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--pipeline", type=int, default=256)
    p.add_argument("--direct-shapes", default="",
                   help="JOBSxPIPELINE,... read straight from Redis each round (e.g. 8x4,8x256)")
    p.add_argument("--data-dir", default="/dev/shm/dsfs-bench-data")
    p.add_argument("--name", default="proxy_threads")
    p.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    dsfs = os.path.abspath(os.path.join(args.build, "dsfs"))
    raw = os.path.abspath(os.path.join(args.build, "bench", "dsfs_bench_redis_raw"))
    workdir = tempfile.mkdtemp(prefix="dsfs-proxy-threads-")
    env = private_env(workdir)
    redis = None
    figures = {t: [] for t in threads}
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.direct_shapes.split(",")
              if shape]
    direct = {shape: [] for shape in shapes}

    def epoch(url, jobs, pipeline, seed):
        out = os.path.join(workdir, "raw.json")
        redis_before = process_usage(redis.proc.pid)["cpu_s"]
        run([raw, "--redis", url, "--dataset", "bench", "--pattern", "epochs", "--jobs", jobs,
             "--pipeline", pipeline, "--epochs", 1, "--seed", seed, "--json", out], env=env,
            timeout=900)
        redis_cpu = process_usage(redis.proc.pid)["cpu_s"] - redis_before
        with open(out) as f:
            e = json.load(f)["epochs"][0]
        return e, 1e6 * redis_cpu / max(1, e["files"])

    try:
        data, _ = synth_dataset(dsfs, args.data_dir, args.files)
        redis = RedisServer(workdir)
        run([dsfs, "ingest", data, "--dataset", "bench", "--redis", redis.url, "--progress",
             "none"], env=env)
        for round_index in range(args.rounds):
            for jobs, pipeline in shapes:
                e, redis_us = epoch(redis.url, jobs, pipeline, 1000 + round_index)
                direct[(jobs, pipeline)].append({"files_per_s": e["files_per_s"],
                                                 "redis_cpu_us_per_file": redis_us})
                log(f"round {round_index + 1}, straight to Redis, {jobs} x {pipeline} in flight: "
                    f"{e['files_per_s']:.0f} files/s, Redis CPU {redis_us:.0f} us/file")
            for t in (threads if round_index % 2 == 0 else threads[::-1]):
                proxy = Proxy(dsfs, workdir, redis.sock, args.rtt, threads=t)
                try:
                    before = process_usage(proxy.proc.pid)
                    e, redis_us = epoch(proxy.url, args.jobs, args.pipeline, 1000 + round_index)
                    after = process_usage(proxy.proc.pid)
                    cpu = after["cpu_s"] - before["cpu_s"]
                    faults = after["minor_faults"] - before["minor_faults"]
                finally:
                    proxy.close()
                fig = {"files_per_s": e["files_per_s"],
                       "proxy_cpu_us_per_file": 1e6 * cpu / max(1, e["files"]),
                       "proxy_faults_per_file": faults / max(1, e["files"]),
                       "redis_cpu_us_per_file": redis_us}
                figures[t].append(fig)
                log(f"round {round_index + 1}, {t} proxy thread(s): {fig['files_per_s']:.0f} "
                    f"files/s, proxy CPU {fig['proxy_cpu_us_per_file']:.0f} us/file, "
                    f"{fig['proxy_faults_per_file']:.1f} page faults/file, Redis CPU "
                    f"{redis_us:.0f} us/file")
    finally:
        if redis:
            redis.close()
        shutil.rmtree(workdir, ignore_errors=True)
    results = {"machine": machine_info(), "config": vars(args), "cases": [
        {"threads": t, "runs": figures[t],
         "files_per_s": median([f["files_per_s"] for f in figures[t]]),
         "proxy_cpu_us_per_file": median([f["proxy_cpu_us_per_file"] for f in figures[t]]),
         "proxy_faults_per_file": median([f["proxy_faults_per_file"] for f in figures[t]]),
         "redis_cpu_us_per_file": median([f["redis_cpu_us_per_file"] for f in figures[t]])}
        for t in threads], "direct": [
        {"jobs": jobs, "pipeline": pipeline, "runs": direct[(jobs, pipeline)],
         "files_per_s": median([f["files_per_s"] for f in direct[(jobs, pipeline)]]),
         "redis_cpu_us_per_file": median([f["redis_cpu_us_per_file"]
                                          for f in direct[(jobs, pipeline)]])}
        for jobs, pipeline in shapes]}
    os.makedirs(args.results_dir, exist_ok=True)
    path = os.path.join(args.results_dir, args.name)
    with open(path + ".json", "w") as f:
        json.dump(results, f, indent=1)
    for c in results["cases"]:
        print(f"{c['threads']} thread(s): {c['files_per_s']:,.0f} files/s (runs "
              f"{', '.join(format(r['files_per_s'], ',.0f') for r in c['runs'])}), proxy "
              f"{c['proxy_cpu_us_per_file']:.0f} us CPU and {c['proxy_faults_per_file']:.1f} page "
              f"faults per file")
    for d in results["direct"]:
        print(f"straight to Redis, {d['jobs']} x {d['pipeline']}: {d['files_per_s']:,.0f} files/s, "
              f"Redis {d['redis_cpu_us_per_file']:.0f} us CPU per file")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"results: {path}.json (no matplotlib here: no plot)")
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([str(c["threads"]) for c in results["cases"]],
           [c["files_per_s"] for c in results["cases"]])
    ax.set_xlabel("dsfs proxy --threads")
    ax.set_ylabel("raw GETs through it, files/s")
    ax.set_title(f"{args.rtt} ms, {args.jobs} x {args.pipeline} in flight, "
                 f"{results['machine']['cpus']} CPUs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path + ".png", dpi=110)
    log(f"results: {path}.json, {path}.png")


if __name__ == "__main__":
    main()
