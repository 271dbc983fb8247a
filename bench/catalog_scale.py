#!/usr/bin/python3
"""Catalogue memory and mount time at ImageNet scale.

For each dataset size N (default 10k, 100k and ImageNet train's 1,281,167 files of tiny
objects), publishes a synthetic dataset into a fresh redis-server, then times a real
`dsfs mount` (manifest fetched, decoded and mounted) and reads the mount daemon's RSS against a
baseline mount of a 1-file dataset. Writes bench/results/catalog_scale.json and .png.

    bench/catalog_scale.py [--build build] [--sizes 10000,100000,1281167] [--runs 3]
"""
import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def mount_pid(mnt):
    out = subprocess.run(["pgrep", "-f", f"dsfs mount {mnt}"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def measure_mount(dsfs, url, dataset, mnt, env):
    start = time.perf_counter()
    subprocess.run([dsfs, "mount", mnt, "--dataset", dataset, "--redis", url], check=True, env=env)
    seconds = time.perf_counter() - start
    pid = mount_pid(mnt)
    rss_after_mount = rss_kib(pid)
    subprocess.run(["find", mnt, "-type", "f"], check=True, stdout=subprocess.DEVNULL)
    rss_after_walk = rss_kib(pid)
    subprocess.run([dsfs, "umount", mnt], check=True, env=env)
    return seconds, rss_after_mount, rss_after_walk


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--sizes", default="10000,100000,1281167")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "catalog_scale"))
    args = ap.parse_args()
    dsfs = os.path.abspath(os.path.join(args.build, "dsfs"))
    gen = os.path.abspath(os.path.join(args.build, "bench", "dsfs_bench_catalog_scale"))
    tmp = tempfile.mkdtemp(prefix="dsfs-bench-")
    env = dict(os.environ, DSFS_HOME=os.path.join(tmp, "home"))
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly",
                              "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    results = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release()}, "sizes": []}
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)
        mnt = os.path.join(tmp, "mnt")
        os.makedirs(mnt)
        subprocess.run([gen, "--redis", url, "--dataset", "baseline", "--files", "1",
                        "--classes", "1"], check=True, stdout=subprocess.DEVNULL)
        base = [measure_mount(dsfs, url, "baseline", mnt, env) for _ in range(args.runs)]
        base_rss = statistics.median(b[1] for b in base)
        for n in [int(s) for s in args.sizes.split(",")]:
            name = f"scale{n}"
            out = subprocess.run([gen, "--redis", url, "--dataset", name, "--files", str(n)],
                                 check=True, capture_output=True, text=True).stdout
            publish = json.loads(out)
            runs = [measure_mount(dsfs, url, name, mnt, env) for _ in range(args.runs)]
            mount_s = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs)
            rss_walk = statistics.median(r[2] for r in runs)
            row = dict(publish, mount_s=mount_s, mount_runs_s=[r[0] for r in runs],
                       daemon_rss_kib=rss, daemon_rss_after_find_kib=rss_walk,
                       baseline_rss_kib=base_rss,
                       rss_bytes_per_file=(rss - base_rss) * 1024 / n,
                       rss_bytes_per_file_after_find=(rss_walk - base_rss) * 1024 / n)
            results["sizes"].append(row)
            print(f"{n:>9} files: mount {mount_s:.2f} s, manifest {publish['manifest_bytes']/1e6:.1f}"
                  f" MB, decode {publish['decode_s']:.2f} s, catalogue "
                  f"{publish['catalog_bytes_per_file_excluding_names']:.0f} B/file + names, "
                  f"daemon RSS +{row['rss_bytes_per_file']:.0f} B/file "
                  f"(+{row['rss_bytes_per_file_after_find']:.0f} after find)", flush=True)
            subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], check=True,
                           stdout=subprocess.DEVNULL)
            subprocess.run([gen, "--redis", url, "--dataset", "baseline", "--files", "1",
                            "--classes", "1"], check=True, stdout=subprocess.DEVNULL)
    finally:
        redis.terminate()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = [r["files"] for r in results["sizes"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ns, [r["catalog_bytes_per_file_excluding_names"] for r in results["sizes"]], "o-",
           label="catalogue, excl. names")
    a.plot(ns, [r["rss_bytes_per_file"] for r in results["sizes"]], "s-",
           label="mount daemon RSS")
    a.plot(ns, [r["rss_bytes_per_file_after_find"] for r in results["sizes"]], "^-",
           label="RSS after find (kernel inodes)")
    a.axhline(100, color="gray", ls="--", label="budget: 100 B + name")
    a.set_xscale("log"); a.set_xlabel("files"); a.set_ylabel("bytes per file"); a.legend()
    b.plot(ns, [r["mount_s"] for r in results["sizes"]], "o-", label="dsfs mount (ready)")
    b.plot(ns, [r["decode_s"] for r in results["sizes"]], "s-", label="manifest decode")
    b.set_xscale("log"); b.set_xlabel("files"); b.set_ylabel("seconds (median)"); b.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=100)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
