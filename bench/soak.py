#!/usr/bin/python3
"""The fault-injection soak (tests/integration/test_soak_faults.py) for longer: 64 readers on a
mount whose Redis sits behind `dsfs proxy` injecting resets, truncated replies, stalls and
refused connects, with a Redis restart every --restart-every seconds; every read checked
against the source files' SHA-256. Same dataset, faults, mount options and checks as the CI test.

Writes bench/results/soak.json (the checks, totals and a timeline, one sample a second) and
bench/results/soak.png (the daemon's RSS, descriptors and threads over time; files read and
errors per second; faults injected). Exit 1 if a check failed.

    nice -n 10 bench/soak.py [--minutes 10] [--verify] [--disk-cache] [--build build]
                             [--out bench/results] [--name soak]
    bench/soak.py --replot      # redraw NAME.png from NAME.json

--disk-cache runs the CI test's disk-tier variant (test_soak_with_a_disk_tier): a --disk-cache
smaller than the dataset, whose files are damaged (a byte flipped, cut short, removed) ten
times a second while the readers read; the tier's checks are added to the others.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10, help="load time (default 10)")
    parser.add_argument("--restart-every", type=float, default=120,
                        help="seconds between Redis restarts (default 120; at least one)")
    parser.add_argument("--verify", action="store_true", help="mount with --verify")
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                        help="build directory holding the dsfs binary")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="where soak.json and soak.png go")
    parser.add_argument("--disk-cache", action="store_true",
                        help="mount with a disk tier smaller than the dataset, damaged while "
                             "the readers read")
    parser.add_argument("--name", default="soak",
                        help="results are NAME.json and NAME.png (default soak)")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw NAME.png from the NAME.json in --out")
    return parser.parse_args()


def per_second(timeline, key):
    """(t, rate) of a cumulative counter in the timeline."""
    points = []
    for a, b in zip(timeline, timeline[1:]):
        dt = b["t"] - a["t"]
        if dt > 0:
            points.append((b["t"], (b[key] - a[key]) / dt))
    return points


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["timeline"]
    t = [p["t"] for p in timeline]
    fig, (memory, counts, rates, faults) = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    memory.plot(t, [p["rss"] / 2**20 for p in timeline], label="daemon RSS")
    memory.axhline(result["rss_bound"] / 2**20, color="red", linestyle="--",
                   label="bound: cache + constant")
    memory.axhline(result["cache_bytes"] / 2**20, color="gray", linestyle=":", label="cache size")
    memory.set_ylabel("MiB")
    memory.legend(loc="lower right")
    counts.plot(t, [p["fds"] for p in timeline], label="descriptors")
    counts.plot(t, [p["sockets"] for p in timeline], label="of which sockets")
    counts.plot(t, [p["threads"] for p in timeline], label="threads")
    counts.set_ylabel("count")
    counts.legend(loc="lower right")
    for key, label in (("ok_files", "files read whole /s"), ("errors", "EIO /s")):
        points = per_second(timeline, key)
        rates.plot([x for x, _ in points], [y for _, y in points], label=label, linewidth=0.8)
    rates.set_yscale("symlog")
    rates.set_ylabel("per second")
    rates.legend(loc="lower right")
    for kind in ("resets", "truncations", "stalls", "refuse_windows"):
        faults.plot(t, [p.get("proxy_faults", {}).get(kind, 0) for p in timeline], label=kind)
    faults.set_ylabel("faults injected (cumulative)")
    faults.set_xlabel("seconds")
    faults.legend(loc="upper left")
    for axis in (memory, counts, rates, faults):
        for restart in result["restarts"]:
            axis.axvspan(restart["stopped_at_s"], restart["started_at_s"], color="orange",
                         alpha=0.3)
    fig.suptitle(f"dsfs fault soak: {result['readers']} readers, {result['seconds']:.0f} s, "
                 f"--verify {'on' if result['verify'] else 'off'}; orange: Redis down")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    args = parse_args()
    if args.replot:
        with open(os.path.join(args.out, f"{args.name}.json")) as f:
            plot(json.load(f), os.path.join(args.out, f"{args.name}.png"))
        return 0
    os.environ.setdefault("DSFS_BIN", os.path.abspath(os.path.join(args.build, "dsfs")))
    import harness
    import test_soak_faults as soak

    seconds = args.minutes * 60
    restarts = max(1, int(seconds // args.restart_every))
    tmp = tempfile.mkdtemp(prefix="dsfs-soak-")
    env = dict(os.environ, DSFS_HOME=os.path.join(tmp, "home"))
    env.pop("DSFS_REDIS", None)
    redis = harness.RedisServer(tmp).start()
    proxy = None
    mnt = os.path.join(tmp, "mnt")
    try:
        data = os.path.join(tmp, "data")
        expected = soak.synth_dataset(data)
        harness.run([harness.DSFS, "ingest", data, "--dataset", "soak", "--chunk-size", "1MiB",
                     "--redis", redis.url], env=env)
        proxy = soak.FaultyProxy(tmp, redis.port)
        os.makedirs(mnt)
        command = [harness.DSFS, "mount", mnt, "--redis", proxy.url,
                   "--cache-size", str(soak.CACHE_BYTES), "--timeout", f"{soak.MOUNT_TIMEOUT_S}s"]
        if args.verify:
            command.append("--verify")
        tier_dir = os.path.join(tmp, "disk-cache") if args.disk_cache else None
        if tier_dir:
            command += ["--disk-cache", tier_dir, "--disk-cache-size", str(soak.DISK_CACHE_BYTES)]
        harness.run(command, env=env)
        print(f"soak: {seconds:g} s, {soak.READERS} readers, {restarts} Redis restarts, "
              f"proxy faults: {' '.join(soak.PROXY_FAULTS)}", flush=True)
        r = soak.run_soak(redis, proxy, mnt, "soak", expected, seconds, restarts=restarts,
                          tier_faults=soak.TierFaults(tier_dir) if tier_dir else None)
        faults = soak.fault_counts(r["proxy"])
        failures = soak.soak_failures(r, faults, len(expected))
    finally:
        if harness.is_mounted(mnt):
            subprocess.run([harness.DSFS, "umount", mnt], capture_output=True)
        if proxy:
            proxy.stop()
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "load_average_after": os.getloadavg()},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verify": args.verify, "readers": soak.READERS, "files": len(expected),
        "dataset_bytes": sum(size for size, _ in expected.values()),
        "cache_bytes": soak.CACHE_BYTES, "rss_bound": soak.rss_bound(r),
        "disk_cache_bytes": soak.DISK_CACHE_BYTES if args.disk_cache else None,
        "mount_timeout_s": soak.MOUNT_TIMEOUT_S, "hang_guard_s": soak.hang_guard(r),
        "redis_down_s": soak.REDIS_DOWN_S, "proxy_faults": soak.PROXY_FAULTS,
        "faults_injected": faults, "passed": not failures, "failures": failures,
    }
    result.update({k: v for k, v in r.items() if k not in ("before", "after")})
    for when in ("before", "after"):
        result[when] = {k: v for k, v in r[when].items() if k != "other_fds"}
        result[when]["other_fds"] = len(r[when]["other_fds"])
    os.makedirs(args.out, exist_ok=True)
    # One sample a second (they were taken every 0.25 s; max_rss saw them all).
    result["timeline"] = result["timeline"][::4]
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(args.out, f"{args.name}.png"))
    print(f"{r['ok_files']} files read whole ({r['ok_bytes'] / 1e9:.1f} GB), {len(r['wrong'])} "
          f"wrong, errors {r['errors']}, slowest call {r['slowest_call_s']} s; max RSS "
          f"{r['max_rss'] >> 20} MiB (bound {result['rss_bound'] >> 20}); threads "
          f"{r['before']['threads']} -> {r['after']['threads']}, fds {r['before']['fds']} -> "
          f"{r['after']['fds']}; faults {faults}")
    print("PASSED" if not failures else "FAILED:\n  " + "\n  ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
