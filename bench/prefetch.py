#!/usr/bin/python3
"""The prefetch engine's benchmark (issue 4): throughput against RTT with and without
prefetching, hit rate against cache size, and what the engine costs in memory and CPU.

    bench/prefetch.sh [--quick] [--build DIR] [--files N] [--runs R] [--parts rtt,loader,...]

Synthesizes an ImageNet-like dataset into tmpfs (`dsfs synth`), ingests it into a private
redis-server on a unix socket, then, through `dsfs proxy --rtt X` for each RTT:

  rtt      `dsfs bench MOUNT/bench --pattern epochs --jobs 8 --drop-caches`, 3 epochs, for
           --prefetch off, auto (cache holding the whole dataset), auto with a 25% cache, and
           plan (`dsfs bench --plan` on an auto mount, 25% cache). Each epoch is its own
           `dsfs bench --epochs 1 --seed S+E` run (the orders of one `--epochs 3 --seed S` run),
           so stats.json can be read between epochs for per-epoch hit rates. Epoch 1 and the
           steady epochs (2-3) are reported apart; median of --runs runs.
  loader   a PyTorch DataLoader (8 workers, batch 64, raw bytes, shuffled) for the same modes;
           plan through tools/python/dsfs_torch.PlanSampler.
  hitrate  shuffled epochs without a hint, cache 5-100% of the dataset: hit rate of epochs 2-3
           for --prefetch auto and off (the same cache as plain LRU), against an exact LRU
           simulation and the bound k/N(1+ln(N/k)) of any policy that does not know the order.
  memory   the mount daemon's RSS and CPU seconds for off against auto (from the rtt part's
           mounts, same cache size, same epochs).

Writes bench/results/NAME.json, NAME-rtt.png, NAME-hitrate.png and (unless --quick or
--no-docs) the generated section of docs/benchmarks.md. Needs root (mounts, drop_caches).
Everything it starts (mounts, proxies, redis-server, the dataset it synthesized) is removed on
exit, Ctrl-C included.
"""
import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, Proxy, build_binary, build_source, close_bench,  # noqa: E402
                    drop_caches, load_average, log, machine_info, make_workdir, median,
                    mount_daemon_pid, prepare_dataset, process_usage, run, serve_dataset, unmount,
                    update_docs_section)

JOBS = 8
DOCS_START = "<!-- bench/prefetch.py: start -->"
DOCS_END = "<!-- bench/prefetch.py: end -->"
DOCS_HEADING = "## Prefetching (issue 4, `bench/prefetch.sh`)"
OWN_ZERO_GOAL = 0.9      # at 100 ms, at least 90% of the mode's own 0 ms throughput
OVER_OFF_GOAL = 30       # ... and at least 30 times --prefetch off
GOAL_RTT_MS = 100
HITRATE_RTT_MS = 1
PARTS = ("rtt", "loader", "hitrate", "memory")

# Sweep modes: how the mount prefetches, its cache as a fraction of the dataset's bytes (None:
# one that holds the whole dataset), and whether the reader writes each epoch's order to the plan.
MODES = OrderedDict([
    ("off", {"prefetch": "off", "cache": 0.25, "plan": False,
             "label": "--prefetch off, 25% cache"}),
    ("auto", {"prefetch": "auto", "cache": None, "plan": False,
              "label": "auto, no hint, cache holds the dataset"}),
    ("auto-25%", {"prefetch": "auto", "cache": 0.25, "plan": False,
                  "label": "auto, no hint, 25% cache"}),
    ("plan", {"prefetch": "auto", "cache": 0.25, "plan": True,
              "label": "auto + plan (each epoch's order written first), 25% cache"}),
])


# ---- figures from stats.json ------------------------------------------------------------------

def stats_delta(before, after):
    """What happened between two stats.json snapshots: reads by outcome, hit rate, bytes
    prefetched / used / wasted, stall seconds, GETs; and the engine's state at the end."""
    p0, p1 = before["prefetch"], after["prefetch"]
    reads = {k: p1["reads"][k] - p0["reads"][k] for k in ("ready", "joined", "miss")}
    total = sum(reads.values())
    return {
        "reads": reads,
        "hit_rate": (reads["ready"] + reads["joined"]) / total if total else 0.0,
        "ready_rate": reads["ready"] / total if total else 0.0,
        "prefetched_bytes": p1["bytes"]["prefetched"] - p0["bytes"]["prefetched"],
        "used_bytes": p1["bytes"]["used"] - p0["bytes"]["used"],
        "wasted_bytes": p1["bytes"]["wasted"] - p0["bytes"]["wasted"],
        "stall_s": p1["stall_us"]["total_s"] - p0["stall_us"]["total_s"],
        "stall_p99_us": p1["stall_us"]["p99"],
        "gets": after["redis_ops"]["gets"] - before["redis_ops"]["gets"],
        "leader": p1["leader"],
        "engine_epoch": p1["epoch"],
        "rtt_ms": p1["rtt_ms"],
        "inflight_max": p1["inflight"]["max"],
        "plan_entries": p1["plan"]["entries"],
        "plan_unresolved": p1["plan"]["unresolved"],
        "cache_bytes": after["cache"]["bytes"],
    }


def summarize_runs(runs):
    """Medians over runs of epoch-1 and steady (epochs 2+) files/s and hit rates."""
    def steady(epochs, key):
        later = epochs[1:] or epochs
        if key == "files_per_s":
            seconds = sum(e["seconds"] for e in later)
            return sum(e["files"] for e in later) / seconds if seconds else 0.0
        reads = [sum(e["stats"]["reads"][k] for e in later) for k in ("ready", "joined", "miss")]
        return (reads[0] + reads[1]) / sum(reads) if sum(reads) else 0.0

    epochs = [r["epochs"] for r in runs]
    return {
        "first_files_per_s": median([e[0]["files_per_s"] for e in epochs]),
        "steady_files_per_s": median([steady(e, "files_per_s") for e in epochs]),
        "first_hit_rate": median([e[0]["stats"]["hit_rate"] for e in epochs]),
        "steady_hit_rate": median([steady(e, "hit_rate") for e in epochs]),
        "steady_from_first_epoch": all(len(e) == 1 for e in epochs),
        "cut_short": any(not x["complete"] for e in epochs for x in e),
        "runs": runs,
    }


def lru_hit_rate(sizes, capacity, epochs, seed):
    """Exact LRU over `epochs` shuffled epochs of files with these sizes and a byte capacity:
    the hit rate of epochs 2..epochs (what a page cache of that size would give)."""
    rng = random.Random(seed)
    cache = OrderedDict()
    held = 0
    hits = reads = 0
    order = list(range(len(sizes)))
    for epoch in range(epochs):
        rng.shuffle(order)
        for i in order:
            if i in cache:
                cache.move_to_end(i)
                hits += epoch > 0
            else:
                cache[i] = True
                held += sizes[i]
                while held > capacity and cache:
                    evicted, _ = cache.popitem(last=False)
                    held -= sizes[evicted]
            reads += epoch > 0
    return hits / reads if reads else 0.0


def unread_set_bound(fraction):
    """The best hit rate over a shuffled epoch of any cache of k = fraction·N files that does
    not know the order: keep k unread files; the next read hits with probability k/unread."""
    if fraction >= 1:
        return 1.0
    return fraction * (1 + math.log(1 / fraction))


# ---- the benchmark ------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.dsfs = build_binary(args.build)
        self.workdir, self.env, self.mnt = make_workdir("dsfs-prefetch-bench-")
        self.redis = None
        self.proxy = None
        self.created_data = None
        self.results = {"machine": machine_info(), "config": vars(args).copy(),
                        "build": build_source(args.build),
                        "load_average": {"start": load_average()}}

    # ---- setup and teardown ----

    def start(self):
        data = prepare_dataset(self)
        self.file_sizes = [os.path.getsize(os.path.join(d, n))
                           for d, _, names in os.walk(data) for n in names]
        serve_dataset(self, data)

    def close(self):
        close_bench(self)

    def use_proxy(self, rtt_ms):
        """The proxy for this RTT, replacing any other."""
        if self.proxy and self.proxy.rtt_ms == rtt_ms:
            return self.proxy
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        self.proxy = Proxy(self.dsfs, self.workdir, self.redis.sock, rtt_ms)
        self.proxy.rtt_ms = rtt_ms
        return self.proxy

    def cache_bytes(self, fraction):
        total = self.dataset["bytes"]
        if fraction is None:  # the whole dataset, with room for the cache's own accounting
            return max(int(total * 1.1), total + (256 << 20))
        return max(1 << 20, int(total * fraction))

    def mount(self, url, prefetch, cache_bytes):
        run([self.dsfs, "mount", self.mnt, "--redis", url, "--dataset", "bench", "--prefetch",
             prefetch, "--cache-size", cache_bytes, "--timeout", "120s"], env=self.env)
        self.daemon = mount_daemon_pid(self.mnt)
        return os.path.join(self.mnt, "bench")

    def umount(self):
        unmount(self.dsfs, self.mnt, self.env)

    def stats(self):
        with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
            return json.load(f)

    # ---- one mount, several epochs ----

    def bench_epochs(self, path, epochs, seed, plan, epoch_seconds):
        """`epochs` back-to-back `dsfs bench --epochs 1` runs with seeds seed, seed+1, ...:
        per-epoch figures with the stats.json delta of each."""
        out = os.path.join(self.workdir, "bench.json")
        figures = []
        for epoch in range(epochs):
            before = self.stats()
            args = [self.dsfs, "bench", path, "--pattern", "epochs", "--jobs", JOBS, "--epochs",
                    1, "--seed", seed + epoch, "--drop-caches", "--json", out]
            if plan:
                args.append("--plan")
            if epoch_seconds:
                args += ["--duration", f"{epoch_seconds}s"]
            run(args, timeout=max(600, 10 * (epoch_seconds or 60)))
            after = self.stats()
            with open(out) as f:
                report = json.load(f)
            e = report["epochs"][0]
            if e["errors"]:
                raise RuntimeError(f"dsfs bench reported {e['errors']} read errors: "
                                   f"{report['errors']['first'][:3]}")
            figures.append({"epoch": epoch + 1, "files": e["files"], "seconds": e["seconds"],
                            "files_per_s": e["files_per_s"], "mb_per_s": e["mb_per_s"],
                            "complete": e["complete"], "p50_ms": e["latency_ms"]["p50"],
                            "p99_ms": e["latency_ms"]["p99"],
                            "plan_seconds": e.get("plan_seconds"),
                            "stats": stats_delta(before, after)})
        return figures

    def measured_mount(self, url, mode, work):
        """Mounts for `mode`, runs work(path) and returns its result with the daemon's memory
        and CPU over it."""
        spec = MODES[mode]
        cache = self.cache_bytes(spec["cache"])
        path = self.mount(url, spec["prefetch"], cache)
        try:
            start = process_usage(self.daemon) if self.daemon else None
            result = work(path)
            end = process_usage(self.daemon) if self.daemon else None
            final = self.stats()
        finally:
            self.umount()
        usage = None
        if start and end:
            usage = {"cache_capacity_bytes": cache, "cache_bytes_end": final["cache"]["bytes"],
                     "rss_start_bytes": start["rss_bytes"], "rss_end_bytes": end["rss_bytes"],
                     "hwm_bytes": end["hwm_bytes"], "cpu_s": end["cpu_s"] - start["cpu_s"]}
        return result, usage

    # ---- parts ----

    def measure_rtt(self):
        sweep = self.results.setdefault("rtt", {})
        for rtt in self.args.rtts:
            proxy = self.use_proxy(rtt)
            for mode in self.args.modes:
                spec = MODES[mode]
                # Without prefetching a far Redis makes an epoch take minutes; nothing is read
                # twice within one, so one epoch cut at --epoch-seconds tells the steady rate.
                epochs = 1 if mode == "off" and rtt >= 10 else self.args.epochs
                runs = []
                for rep in range(self.args.runs):
                    def work(path, rep=rep, epochs=epochs):
                        return self.bench_epochs(path, epochs, 1000 * (rep + 1), spec["plan"],
                                                 self.args.epoch_seconds)
                    figures, usage = self.measured_mount(proxy.url, mode, work)
                    runs.append({"epochs": figures, "usage": usage})
                    files = sum(e["files"] for e in figures)
                    if usage:
                        usage["cpu_us_per_file"] = 1e6 * usage["cpu_s"] / files if files else None
                    log(f"rtt {rtt} ms {mode} run {rep + 1}: " + ", ".join(
                        f"e{e['epoch']} {e['files_per_s']:.0f} files/s hit "
                        f"{100 * e['stats']['hit_rate']:.1f}%{'' if e['complete'] else ' (cut)'}"
                        for e in figures))
                    if any(not e["complete"] for e in figures):
                        break  # epochs cut short: one run says what there is to say
                entry = summarize_runs(runs)
                entry.update(rtt_ms=rtt, mode=mode, cache_bytes=self.cache_bytes(spec["cache"]),
                             epochs=epochs)
                sweep.setdefault(mode, {})[str(rtt)] = entry
                log(f"rtt {rtt} ms {mode}: epoch 1 {entry['first_files_per_s']:.0f} files/s, "
                    f"steady {entry['steady_files_per_s']:.0f} files/s, steady hit rate "
                    f"{100 * entry['steady_hit_rate']:.1f}%")
                self.save()

    def measure_loader(self):
        script = os.path.abspath(__file__)
        results = self.results.setdefault("loader", {})
        for rtt in self.args.loader_rtts:
            proxy = self.use_proxy(rtt)
            for mode in self.args.modes:
                spec = MODES[mode]
                epochs = 1 if mode == "off" and rtt >= 10 else self.args.epochs
                runs = []
                for rep in range(self.args.loader_runs):
                    out = os.path.join(self.workdir, "loader.json")

                    def work(path, rep=rep, epochs=epochs):
                        run_process_group(
                            ["/usr/bin/python3", script, "--loader-child", path, "--epochs",
                             epochs, "--seconds", self.args.epoch_seconds, "--seed", rep,
                             "--json", out, "--workers", self.args.loader_workers] +
                            (["--plan"] if spec["plan"] else []), timeout=3600)
                        with open(out) as f:
                            return json.load(f)["epochs"]
                    figures, usage = self.measured_mount(proxy.url, mode, work)
                    runs.append({"epochs": figures, "usage": usage})
                    log(f"loader rtt {rtt} ms {mode} run {rep + 1}: " + ", ".join(
                        f"e{e['epoch']} {e['files_per_s']:.0f} images/s hit "
                        f"{100 * e['stats']['hit_rate']:.1f}%{'' if e['complete'] else ' (cut)'}"
                        for e in figures))
                    if any(not e["complete"] for e in figures):
                        break
                entry = summarize_runs(runs)
                entry.update(rtt_ms=rtt, mode=mode, epochs=epochs)
                results.setdefault(mode, {})[str(rtt)] = entry
                self.save()

    def measure_hitrate(self):
        proxy = self.use_proxy(HITRATE_RTT_MS)
        sizes = self.file_sizes
        results = self.results.setdefault("hitrate", {"rtt_ms": HITRATE_RTT_MS, "sizes": {}})
        for fraction in self.args.cache_fractions:
            entry = {"fraction": fraction, "bound": unread_set_bound(fraction),
                     "lru_simulated": median([
                         lru_hit_rate(sizes, fraction * self.dataset["bytes"], self.args.epochs,
                                      seed) for seed in range(3)])}
            for prefetch in ("auto", "off"):
                runs = []
                for rep in range(self.args.hitrate_runs):
                    cache = max(1 << 20, int(fraction * self.dataset["bytes"]))
                    path = self.mount(proxy.url, prefetch, cache)
                    try:
                        figures = self.bench_epochs(path, self.args.epochs, 7000 + 100 * rep,
                                                    False, None)
                    finally:
                        self.umount()
                    runs.append({"epochs": figures})
                summary = summarize_runs(runs)
                entry[prefetch] = {"steady_hit_rate": summary["steady_hit_rate"],
                                   "first_hit_rate": summary["first_hit_rate"],
                                   "steady_files_per_s": summary["steady_files_per_s"],
                                   "runs": runs}
            results["sizes"][str(fraction)] = entry
            log(f"hit rate, cache {100 * fraction:.0f}%: auto "
                f"{100 * entry['auto']['steady_hit_rate']:.1f}%, off (LRU) "
                f"{100 * entry['off']['steady_hit_rate']:.1f}%, LRU simulated "
                f"{100 * entry['lru_simulated']:.1f}%, bound {100 * entry['bound']:.1f}%")
            self.save()

    def summarize_memory(self):
        """off against auto on the same cache (25%), same epochs: the daemon's memory beyond
        its cache's bytes and its CPU per file read, from the rtt part's mounts."""
        sweep = self.results.get("rtt", {})
        table = {}
        for mode in ("off", "auto-25%", "plan", "auto"):
            for rtt, entry in sweep.get(mode, {}).items():
                usages = [r["usage"] for r in entry["runs"] if r.get("usage")]
                if not usages:
                    continue
                files = [sum(e["files"] for e in r["epochs"]) for r in entry["runs"]
                         if r.get("usage")]
                table.setdefault(mode, {})[rtt] = {
                    "cache_capacity_bytes": usages[0]["cache_capacity_bytes"],
                    "cache_bytes_end": median([u["cache_bytes_end"] for u in usages]),
                    "hwm_bytes": median([u["hwm_bytes"] for u in usages]),
                    "rss_end_bytes": median([u["rss_end_bytes"] for u in usages]),
                    "rss_start_bytes": median([u["rss_start_bytes"] for u in usages]),
                    "rss_beyond_cache_bytes": median([u["rss_end_bytes"] - u["cache_bytes_end"]
                                                      for u in usages]),
                    "cpu_us_per_file": median([1e6 * u["cpu_s"] / f
                                               for u, f in zip(usages, files) if f]),
                    "files": median(files)}
        added = {}
        for rtt in table.get("off", {}):
            off = table["off"][rtt]
            auto = table.get("auto-25%", {}).get(rtt)
            if auto:
                added[rtt] = {
                    "rss_beyond_cache_bytes": auto["rss_beyond_cache_bytes"] -
                    off["rss_beyond_cache_bytes"],
                    "cpu_us_per_file": auto["cpu_us_per_file"] - off["cpu_us_per_file"]}
        self.results["memory"] = {"by_mode": table, "auto_25_over_off": added}

    def summarize_goals(self):
        goals = {}
        for part in ("rtt", "loader"):
            sweep = self.results.get(part, {})
            off = sweep.get("off", {}).get(str(GOAL_RTT_MS))
            for mode in ("auto", "auto-25%", "plan"):
                zero = sweep.get(mode, {}).get("0")
                far = sweep.get(mode, {}).get(str(GOAL_RTT_MS))
                if not zero or not far:
                    continue
                own = far["steady_files_per_s"] / zero["steady_files_per_s"] \
                    if zero["steady_files_per_s"] else 0.0
                over_off = far["steady_files_per_s"] / off["steady_files_per_s"] \
                    if off and off["steady_files_per_s"] else None
                goals[f"{part}:{mode}"] = {
                    "own_0ms_ratio": own, "own_goal_met": own >= OWN_ZERO_GOAL,
                    "over_off": over_off,
                    "over_off_goal_met": over_off is not None and over_off >= OVER_OFF_GOAL,
                    "first_epoch_own_0ms_ratio": far["first_files_per_s"] /
                    zero["first_files_per_s"] if zero["first_files_per_s"] else 0.0}
        hit = self.results.get("hitrate", {}).get("sizes", {})
        goals["hitrate_auto_minus_bound_points"] = {
            k: 100 * (v["auto"]["steady_hit_rate"] - v["bound"]) for k, v in hit.items()}
        self.results["goals"] = goals

    def save(self, final=False):
        """The results: NAME.json when done; NAME.partial.json while running, so an interrupted
        run leaves what it measured without replacing the last complete results."""
        os.makedirs(self.args.results_dir, exist_ok=True)
        prefix = os.path.join(self.args.results_dir, self.args.name)
        with open(prefix + (".json" if final else ".partial.json"), "w") as f:
            json.dump(self.results, f, indent=2)
        if final and os.path.exists(prefix + ".partial.json"):
            os.remove(prefix + ".partial.json")


# ---- the DataLoader (run as a child process on a mount) ------------------------------------------

def run_process_group(args, timeout):
    """Runs a command in a process group of its own; on failure, timeout or interruption the
    whole group (the DataLoader's workers too) is killed, so none keeps the mount busy."""
    proc = subprocess.Popen([str(a) for a in args], start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(map(str, args))}\n"
                           f"{output}")
    # Workers that outlived the loader (none should) go with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return output


def loader_child(args):
    """Reads `args.loader_child` (a dataset root on a dsfs mount) with a DataLoader over raw file
    bytes, `args.epochs` shuffled epochs, each cut at `args.seconds`; the page cache is dropped
    before each; stats.json is read around each epoch."""
    import torch
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    root = args.loader_child
    mount = os.path.dirname(os.path.abspath(root))
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names)

    class RawBytes(Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            with open(paths[i], "rb") as f:
                return len(f.read())

    sampler = RandomSampler(range(len(paths)), generator=torch.Generator().manual_seed(args.seed))
    if args.plan:
        sys.path.insert(0, os.path.join(REPO, "tools", "python"))
        from dsfs_torch import PlanSampler
        sampler = PlanSampler(sampler, mount=mount, paths=paths)
    loader = DataLoader(RawBytes(), batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, persistent_workers=args.workers > 0)

    def stats():
        with open(os.path.join(mount, ".dsfs", "stats.json")) as f:
            return json.load(f)

    epochs = []
    for epoch in range(args.epochs):
        drop_caches()
        before = stats()
        start = time.perf_counter()
        images = 0
        complete = True
        for batch in loader:
            images += len(batch)
            if time.perf_counter() - start > args.seconds:
                complete = images >= len(paths)
                break
        seconds = time.perf_counter() - start
        after = stats()
        epochs.append({"epoch": epoch + 1, "files": images, "seconds": seconds,
                       "files_per_s": images / seconds if seconds else 0.0,
                       "complete": complete, "stats": stats_delta(before, after)})
    with open(args.json, "w") as f:
        json.dump({"epochs": epochs, "workers": args.workers, "torch": torch.__version__}, f)


# ---- plots and docs -----------------------------------------------------------------------------

def plot(results, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"off": "#c44e52", "auto": "#4c72b0", "auto-25%": "#8172b2", "plan": "#55a868"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for part, style, marker in (("rtt", "-", "o"), ("loader", "--", "s")):
        for mode, by_rtt in results.get(part, {}).items():
            points = sorted((int(r), e["steady_files_per_s"]) for r, e in by_rtt.items())
            if not points:
                continue
            what = "dsfs bench" if part == "rtt" else "DataLoader"
            ax.plot([r for r, _ in points], [v for _, v in points], style, marker=marker,
                    color=colors.get(mode), label=f"{mode} ({what})")
    rtts = sorted({int(r) for by in results.get("rtt", {}).values() for r in by if int(r) > 0})
    if rtts:
        ax.plot(rtts, [JOBS / (r / 1000) for r in rtts], ":", color="gray",
                label=f"jobs/RTT ({JOBS} readers, one file per round trip)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_yscale("log")
    ax.set_xlabel("emulated RTT to Redis (ms, dsfs proxy)")
    ax.set_ylabel("files/s, steady epochs (median)")
    d = results["dataset"]
    ax.set_title(f"Prefetching against RTT: {d['files']} files, mean "
                 f"{d['mean_file_bytes'] / 1000:.0f} KB, {JOBS} readers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}-rtt.png", dpi=110)
    plt.close(fig)

    sizes = results.get("hitrate", {}).get("sizes", {})
    if sizes:
        rows = sorted(sizes.values(), key=lambda e: e["fraction"])
        xs = [100 * e["fraction"] for e in rows]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        fine = [x / 100 for x in range(1, 101)]
        ax.plot([100 * f for f in fine], [100 * unread_set_bound(f) for f in fine], "-",
                color="gray", label="bound k/N(1+ln(N/k))")
        ax.plot(xs, [100 * e["auto"]["steady_hit_rate"] for e in rows], "o-",
                color=colors["auto"], label="dsfs --prefetch auto (no hint)")
        ax.plot(xs, [100 * e["off"]["steady_hit_rate"] for e in rows], "s-",
                color=colors["off"], label="dsfs --prefetch off (its cache as LRU)")
        ax.plot(xs, [100 * e["lru_simulated"] for e in rows], "x:", color="black",
                label="exact LRU, simulated")
        ax.set_xlabel("cache size, % of the dataset's bytes")
        ax.set_ylabel("hit rate, epochs 2-3 (%)")
        ax.set_xlim(0, 102)
        ax.set_ylim(0, 102)
        ax.set_title(f"Shuffled epochs without a hint (RTT {results['hitrate']['rtt_ms']} ms)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{prefix}-hitrate.png", dpi=110)
        plt.close(fig)


def markdown(results, name):
    m, d, cfg = results["machine"], results["dataset"], results["config"]
    load = results["load_average"]
    build = results.get("build", {})
    commit = f"dsfs at commit {build['commit']}" + (
        " plus uncommitted changes" if build.get("uncommitted_changes") else "") + ", " \
        if build.get("commit") else ""
    lines = [DOCS_START, "",
             f"Generated by `bench/prefetch.sh` on {m['date']} ({commit}"
             f"{build.get('build_type') or 'unknown'} build): "
             f"{m['cpus']} CPUs "
             f"({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}; load average "
             f"{load['start']:.1f} at the start, {load.get('end', 0):.1f} at the end. Dataset: "
             f"{d['files']} synthetic JPEGs, {d['bytes'] / 1e9:.2f} GB, mean "
             f"{d['mean_file_bytes'] / 1000:.0f} KB, in a private redis-server on a unix socket "
             f"behind `dsfs proxy --rtt X`; Redis, the proxy, dsfs and the readers share the "
             f"machine. Modes: " + "; ".join(f"**{k}** = {v['label']}" for k, v in MODES.items()
                                              if k in cfg["modes"]) + ".", ""]

    def rate(v):
        return f"{v:.0f}"

    sweep = results.get("rtt", {})
    if sweep:
        rtts = sorted({int(r) for by in sweep.values() for r in by})
        lines += [f"`dsfs bench MOUNT/bench --pattern epochs --jobs {JOBS} --drop-caches` "
                  f"(plan: `--plan`), {cfg['epochs']} epochs, each its own `--epochs 1` run so "
                  f"stats.json is read between epochs; median of {cfg['runs']} runs. Files/s of "
                  f"the steady epochs (2-{cfg['epochs']}), then epoch 1, then the hit rate "
                  f"(ready + joined in flight, of all reads) of the steady epochs. Epochs cut at "
                  f"{cfg['epoch_seconds']} s are marked *; those cases ran once. off at 10 ms "
                  f"and more reads one (cut) epoch: nothing is read twice in it, so that is its "
                  f"steady rate.", "",
                  "| mode | " + " | ".join(f"{r} ms" for r in rtts) + " |",
                  "|---|" + "---:|" * len(rtts)]
        for title, key, fmt in (("steady files/s", "steady_files_per_s", rate),
                                ("epoch 1 files/s", "first_files_per_s", rate),
                                ("steady hit rate", "steady_hit_rate",
                                 lambda v: f"{100 * v:.1f}%")):
            for mode, by_rtt in sweep.items():
                cells = []
                for r in rtts:
                    e = by_rtt.get(str(r))
                    cells.append("" if e is None else fmt(e[key]) + ("*" if e["cut_short"]
                                                                     else ""))
                lines.append(f"| {mode}: {title} | " + " | ".join(cells) + " |")
        lines.append("")

    loader = results.get("loader", {})
    if loader:
        rtts = sorted({int(r) for by in loader.values() for r in by})
        lines += [f"PyTorch DataLoader ({cfg['loader_workers']} workers, batch 64, raw file "
                  f"bytes, RandomSampler; plan: `dsfs_torch.PlanSampler` around it), "
                  f"{cfg['epochs']} epochs (off at 10 ms and more: one, cut), page cache "
                  f"dropped before each, {cfg['loader_runs']} run(s); images/s:", "",
                  "| mode | " + " | ".join(f"{r} ms epoch 1 | {r} ms steady | {r} ms steady hit"
                                           for r in rtts) + " |",
                  "|---|" + "---:|" * (3 * len(rtts))]
        for mode, by_rtt in loader.items():
            cells = []
            for r in rtts:
                e = by_rtt.get(str(r))
                if e is None:
                    cells += ["", "", ""]
                    continue
                star = "*" if e["cut_short"] else ""
                cells += [rate(e["first_files_per_s"]) + star,
                          rate(e["steady_files_per_s"]) + star,
                          f"{100 * e['steady_hit_rate']:.1f}%"]
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
        lines.append("")

    goals = results.get("goals", {})
    rows = [(k, v) for k, v in goals.items() if ":" in k]
    if rows:
        lines += [f"Goals at {GOAL_RTT_MS} ms (steady epochs): at least "
                  f"{100 * OWN_ZERO_GOAL:.0f}% of the mode's own 0 ms throughput, and at least "
                  f"{OVER_OFF_GOAL}x `--prefetch off`:", "",
                  "| reader: mode | 100 ms / own 0 ms | goal | x off | goal | epoch 1: 100 ms / "
                  "0 ms |", "|---|---:|---|---:|---|---:|"]
        for key, g in rows:
            part, mode = key.split(":")
            reader = "dsfs bench" if part == "rtt" else "DataLoader"
            over = f"{g['over_off']:.0f}x" if g["over_off"] is not None else "n/a"
            lines.append(f"| {reader}: {mode} | {100 * g['own_0ms_ratio']:.0f}% | "
                         f"{'met' if g['own_goal_met'] else 'not met'} | {over} | "
                         f"{'met' if g['over_off_goal_met'] else 'not met'} | "
                         f"{100 * g['first_epoch_own_0ms_ratio']:.0f}% |")
        lines.append("")

    hit = results.get("hitrate", {})
    if hit.get("sizes"):
        lines += [f"Hit rate against cache size: shuffled epochs, no hint, through the proxy at "
                  f"{hit['rtt_ms']} ms, `--cache-size` = that share of the dataset's bytes, "
                  f"epochs 2-{cfg['epochs']} (reads 2 x {d['files']}), {cfg['hitrate_runs']} "
                  f"run(s). off keeps what was read, oldest evicted first (LRU, what the page "
                  f"cache would do); the simulated LRU replays random epochs over the same file "
                  f"sizes; the bound is the best any policy can do without the order.", "",
                  "| cache | auto | off (LRU, measured) | LRU simulated | bound | auto - bound |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for e in sorted(hit["sizes"].values(), key=lambda e: e["fraction"]):
            a = e["auto"]["steady_hit_rate"]
            lines.append(f"| {100 * e['fraction']:.0f}% | {100 * a:.1f}% | "
                         f"{100 * e['off']['steady_hit_rate']:.1f}% | "
                         f"{100 * e['lru_simulated']:.1f}% | {100 * e['bound']:.1f}% | "
                         f"{100 * (a - e['bound']):+.1f} |")
        lines.append("")

    mem = results.get("memory", {})
    if mem.get("by_mode"):
        lines += ["The mount daemon over the rtt part's mounts (medians): RSS at the end less the "
                  "cache's bytes then (the cache is full in every case but `auto`'s first "
                  "epoch), peak RSS, and CPU seconds (user + system) per file read:", "",
                  "| mode | RTT | cache capacity | cache at end | RSS beyond cache | peak RSS | "
                  "CPU us/file |", "|---|---:|---:|---:|---:|---:|---:|"]
        for mode, by_rtt in mem["by_mode"].items():
            for r, u in sorted(by_rtt.items(), key=lambda kv: int(kv[0])):
                lines.append(f"| {mode} | {r} ms | {u['cache_capacity_bytes'] / 2**20:.0f} MiB | "
                             f"{u['cache_bytes_end'] / 2**20:.0f} MiB | "
                             f"{u['rss_beyond_cache_bytes'] / 2**20:.0f} MiB | "
                             f"{u['hwm_bytes'] / 2**20:.0f} MiB | {u['cpu_us_per_file']:.0f} |")
        added = mem.get("auto_25_over_off", {})
        if added:
            lines += ["", "What the engine adds (auto with a 25% cache against off with the "
                      "same cache): " + "; ".join(
                          f"{r} ms: {a['rss_beyond_cache_bytes'] / 2**20:+.0f} MiB beyond the "
                          f"cache, {a['cpu_us_per_file']:+.0f} us CPU per file"
                          for r, a in sorted(added.items(), key=lambda kv: int(kv[0]))) + "."]
        lines.append("")

    lines += [f"![throughput against RTT per mode](../bench/results/{name}-rtt.png)", ""]
    if hit.get("sizes"):
        lines += [f"![hit rate against cache size](../bench/results/{name}-hitrate.png)", ""]
    lines += [f"Data: `bench/results/{name}.json`. Rerun: `bench/prefetch.sh` (about "
              f"{results.get('elapsed_minutes', 0):.0f} minutes here), or `bench/prefetch.sh "
              f"--quick` for a smoke run.", "", DOCS_END]
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2,000 files, RTT 0 and 10 ms, one run, 5 s epochs "
                         "(about 2 minutes)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="build directory")
    ap.add_argument("--files", type=int, help="dataset size (default 20,000; --quick 2,000)")
    ap.add_argument("--runs", type=int,
                    help="runs per rtt case, the median is reported (default 3; --quick 1)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per mount (default 3)")
    ap.add_argument("--epoch-seconds", type=float,
                    help="cut an epoch after this long (default 30; --quick 5)")
    ap.add_argument("--rtts", type=ints,
                    help="emulated RTTs in ms (default 0,1,10,50,100; --quick 0,10)")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                    help="modes to run (default: " + ",".join(MODES).replace("%", "%%") + ")")
    ap.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS),
                    help="parts to run (default: " + ",".join(PARTS) + ")")
    ap.add_argument("--loader-rtts", type=ints,
                    help="RTTs for the DataLoader in ms (default 0,100; --quick 0,10)")
    ap.add_argument("--loader-workers", type=int, default=8, help="DataLoader workers (8)")
    ap.add_argument("--loader-runs", type=int, default=1, help="runs per DataLoader case (1)")
    ap.add_argument("--cache-fractions", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.05, 0.1, 0.25, 0.5, 1.0],
                    help="cache sizes for the hit-rate part, shares of the dataset's bytes")
    ap.add_argument("--hitrate-runs", type=int, default=1, help="runs per hit-rate case (1)")
    ap.add_argument("--data-dir", default="/dev/shm/dsfs-bench",
                    help="tmpfs directory for the synthetic dataset; one this run synthesizes "
                         "is removed once ingested, one already there is reused and kept")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep a dataset this run synthesized (for later runs)")
    ap.add_argument("--name", help="results name (default prefetch; --quick prefetch_quick)")
    ap.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"),
                    help="where NAME.json and the plots go")
    # The DataLoader child (internal).
    ap.add_argument("--loader-child", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=30, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--plan", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loader_child:
        return args
    args.files = args.files or (2000 if args.quick else 20000)
    args.runs = args.runs or (1 if args.quick else 3)
    args.epoch_seconds = args.epoch_seconds or (5 if args.quick else 30)
    args.rtts = args.rtts or ([0, 10] if args.quick else [0, 1, 10, 50, 100])
    args.loader_rtts = args.loader_rtts or ([0, 10] if args.quick else [0, 100])
    args.name = args.name or ("prefetch_quick" if args.quick else "prefetch")
    if args.quick:
        args.cache_fractions = [0.1, 0.5]
    for mode in args.modes:
        if mode not in MODES:
            ap.error(f"unknown mode {mode}: use {', '.join(MODES)}")
    for part in args.parts:
        if part not in PARTS:
            ap.error(f"unknown part {part}: use {', '.join(PARTS)}")
    if "memory" in args.parts and "rtt" not in args.parts:
        ap.error("the memory part reads the rtt part's mounts: add rtt to --parts")
    return args


def main():
    args = parse_args()
    if args.loader_child:
        return loader_child(args)
    if os.geteuid() != 0:
        sys.exit("bench: needs root (FUSE mounts and /proc/sys/vm/drop_caches)")

    # SIGTERM unwinds like Ctrl-C, so the finally below unmounts and stops what was started.
    def terminate(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started ignoring it

    started = time.time()
    bench = Bench(args)
    try:
        bench.start()
        if "rtt" in args.parts:
            bench.measure_rtt()
        if "loader" in args.parts:
            bench.measure_loader()
        if "hitrate" in args.parts:
            bench.measure_hitrate()
        if "memory" in args.parts:
            bench.summarize_memory()
        bench.summarize_goals()
    finally:
        bench.close()
    results = bench.results
    results["load_average"]["end"] = load_average()
    results["elapsed_minutes"] = (time.time() - started) / 60
    bench.save(final=True)
    prefix = os.path.join(args.results_dir, args.name)
    plot(results, prefix)
    text = markdown(results, args.name)
    print(text)
    if not args.quick and not args.no_docs:
        update_docs_section(DOCS_START, DOCS_END, DOCS_HEADING, text)
        log("updated docs/benchmarks.md")
    log(f"wrote {prefix}.json and its plots in {results['elapsed_minutes']:.1f} minutes")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"bench: interrupted ({str(e) or 'Ctrl-C'}); everything it started is "
                 f"cleaned up")
    except subprocess.TimeoutExpired as e:
        sys.exit(f"bench: {e}")
