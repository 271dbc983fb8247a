#!/usr/bin/python3
"""The local-disk tier (issue 13): shuffled epochs through a mount whose memory cache holds 25% of
the dataset, without and with `dsfs mount --disk-cache DIR --disk-cache-size SIZE` (a tier
sized to hold the whole dataset), at 0 and 100 ms from Redis.

    bench/disk_tier.py [--build build | --builds A,B [--labels a,b]] [--runs 1] [--files 2000]
                       [--rtts 0,100] [--epochs 3] [--epoch-seconds 40] [--readers c,python,plan]
                       [--disk-dir /tmp] [--no-remount] [--no-warm-up] [--name disk_tier]
                       [--quick]

With --builds every case runs with each build in turn (same data, same server, same reader
binary: the first build's), so two builds of the daemon compare side by side in one run.

Synthesizes an ImageNet-like dataset (`dsfs synth`, tmpfs), ingests it into a private
redis-server (unix socket, no persistence) and frees the tmpfs copy. 0 ms = the server's socket;
other RTTs = `dsfs proxy --rtt` in front of it. For every RTT, mode (`none`: no tier; `disk`:
`--disk-cache` on a fresh directory under --disk-dir, sized to the dataset + 1% + 4 KiB per file
+ 16 MiB; --tier-fraction F sizes it to F of that + 16 MiB, a tier that evicts) and reader, a
fresh mount (`--prefetch auto`, `--cache-size` 25% of the data, no plan) reads EPOCHS shuffled epochs, the page cache dropped before each (the tier's files included). Each RTT's cases
follow one unrecorded case (the last mode, the first reader, the first build, one epoch; not
with --no-warm-up): the first case after a fresh proxy, or after the ingest, read slower.

- c: one `dsfs bench MOUNT/bench --pattern epochs --epochs 1 --jobs 8 --drop-caches --seed S+E
  --duration EPOCH_SECONDS` per epoch;
- python: 8 threads, `open(p, "rb").read()` per file (bench/cluster.py's reader);
- plan: the c reader with `--plan`: each epoch's order is written to MOUNT/.dsfs/plan before it
  (the issue's "the same with a plan", which must keep its figure of reads found ready:
  `reads_ready` / `reads_joined` / `reads_miss` per epoch, from stats.json).

An epoch longer than --epoch-seconds is cut there (its files/s is still a rate). Per epoch:
files/s, and from stats.json (before/after) Redis GETs (`redis_ops.gets`), bytes from Redis,
`disk_tier` hits/misses/bytes_read/writes/writes_deferred/writes_dropped/checksum_failures/
page_cache_reads/direct_reads, and `prefetch.disk_reads`. Redis GETs are also counted at the server (INFO commandstats
cmdstat_get; per epoch for the C reader, per mount for the Python reader): stats.json's `redis_ops.gets` counts the readers'
misses only, `prefetch.gets` the engine's.

The remount epoch (`disk` mode; `--no-remount` skips it): after the EPOCHS epochs, `dsfs umount`
(which waits for the daemon to exit, so the tier saves DIR/index), the page cache dropped, the
same `dsfs mount` on the SAME tier directory (timed: `mount_seconds`), and one more shuffled epoch
(seed S+EPOCHS, a new order; the page cache dropped again by the reader) with the same figures,
plus `disk_tier.index_loaded`, `disk_tier.open_seconds` and `disk_tier.entries` at the remount,
and `staged_before_first_read` (`prefetch.disk_staging.before_first_read`: the files a mount on a
tier that holds the dataset stages into memory before the first read; here the reader starts as
soon as the mount returns, so only those staged while it starts and drops the page cache).
Each case gets `remount_epoch` and `remount_ratio` (remount epoch files/s / the median of epochs
2..EPOCHS), and the JSON a `remount_summary` (medians over runs).

Each case's tier stays on disk until the run ends (the disk needs room for all of them: 9 cases
of the issue's 20,000 files take 21 GB; with less room each is removed after its case). On an
ext4 without a journal (this VM's root) a file created within a minute or more of many deletions
costs several times the CPU: the inode allocator checks each recently deleted inode in turn and
skips it. Removing a case's tier just before the next case's epoch 1 made that epoch's
write-behind that much dearer, a cost of the benchmark's own cleanup, not of the tier.

Writes bench/results/NAME.json and NAME.png (--name, default disk_tier). Needs root (mounts,
drop_caches). Everything it starts is removed on exit, also on Ctrl-C and errors.
"""
import argparse
import json
import re
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, Proxy, check_choices, disk_tier_bytes, drop_caches,  # noqa: E402
                    find_builds, fs_type, interrupt_on_signals, load_average, log, machine_info,
                    make_workdir, median, mount_daemon_pid, prepare_dataset, process_usage,
                    relative_paths, remove_created_data, require_root, run, run_bench,
                    save_results, serve_dataset, unmount)
from cluster import PY_READER  # noqa: E402

JOBS = 8
CACHE_FRACTION = 0.25
MODES = ("none", "disk")
MODE_LABELS = {"none": "RAM cache only", "disk": "RAM cache + disk tier"}


def counters(s):
    """The stats.json figures this benchmark follows."""
    d = s.get("disk_tier") or {}
    return {"gets": s["redis_ops"]["gets"], "redis_bytes": s["redis_ops"].get("bytes", 0),
            "prefetch_gets": s["prefetch"].get("gets", 0),
            "prefetched_bytes": s["prefetch"]["bytes"]["prefetched"],
            "disk_reads": s["prefetch"].get("disk_reads", 0),
            **{f"tier_{k}": d.get(k, 0) for k in ("hits", "misses", "bytes_read", "writes",
                                                   "bytes_written", "writes_deferred",
                                                   "writes_dropped", "checksum_failures",
                                                   "read_errors", "write_errors", "evictions",
                                                   "page_cache_reads", "direct_reads")},
            "tier_bytes_used": d.get("bytes_used", 0), "tier_entries": d.get("entries", 0),
            **{f"reads_{k}": s["prefetch"]["reads"][k] for k in ("ready", "joined", "miss")},
            # The readers' time waiting on reads (all of them together): what a file asked of
            # Redis too late costs, beside the files/s.
            "reader_stall_s": s["prefetch"]["stall_us"]["total_s"]}


def delta(before, after):
    out = {k: after[k] - before[k] for k in before}
    out["tier_bytes_used"] = after["tier_bytes_used"]
    out["tier_entries"] = after["tier_entries"]
    return out


def steady(case):
    """The median files/s of a case's steady epochs (2..N), or None with one epoch."""
    ys = [e["files_per_s"] for e in case["epochs"][1:]]
    return median(ys) if ys else None


def remount_summary(results):
    """Per RTT, mode and reader with a remount epoch: medians over runs of the steady epochs'
    median files/s, the remount epoch's files/s, their per-run ratio and its figures."""
    out = []
    keys = []
    for c in results["cases"]:
        k = (c["rtt_ms"], c["mode"], c["reader"], c.get("build"))
        if c.get("remount_epoch") and k not in keys:
            keys.append(k)
    for rtt, mode, reader, build in keys:
        cs = [c for c in results["cases"] if (c["rtt_ms"], c["mode"], c["reader"], c.get("build"))
              == (rtt, mode, reader, build) and c.get("remount_epoch")]
        rs = [c["remount_epoch"] for c in cs]
        out.append({
            "build": build, "rtt_ms": rtt, "mode": mode, "reader": reader, "runs": len(cs),
            "steady_files_per_s": median([c["steady_files_per_s"] for c in cs
                                          if c["steady_files_per_s"]]),
            "remount_files_per_s": median([r["files_per_s"] for r in rs]),
            "remount_files_per_s_range": [min(r["files_per_s"] for r in rs),
                                          max(r["files_per_s"] for r in rs)],
            "ratio": median([c["remount_ratio"] for c in cs if c["remount_ratio"]] or [0]),
            "ratio_per_run": [c["remount_ratio"] for c in cs],
            "remount_complete": all(r["complete"] for r in rs),
            "server_gets": median([r["server_gets"] for r in rs]),
            "gets": median([r["gets"] + r["prefetch_gets"] for r in rs]),
            "tier_hits": median([r["tier_hits"] for r in rs]),
            "tier_mb_read": median([r["tier_bytes_read"] for r in rs]) / 1e6,
            "disk_reads": median([r["disk_reads"] for r in rs]),
            "index_loaded": [r["index_loaded"] for r in rs],
            "open_seconds": median([r["open_seconds"] for r in rs]),
            "mount_seconds": median([r["mount_seconds"] for r in rs]),
            "tier_entries_at_mount": median([r["tier_entries_at_mount"] for r in rs])})
    return out


def server_gets(sock):
    """GETs the redis-server has served: INFO commandstats cmdstat_get calls."""
    out = run(["redis-cli", "-s", sock, "INFO", "commandstats"], timeout=60).stdout
    m = re.search(r"^cmdstat_get:calls=(\d+)", out, re.M)
    return int(m.group(1)) if m else 0


class Bench:
    def __init__(self, args):
        self.args = args
        # Every build runs each case in turn, on the same data and server (--builds); the first
        # one's dsfs synthesizes, ingests and reads (`dsfs bench`), so only the daemon differs.
        builds = find_builds(args.builds, args.labels)
        self.builds = [(label, b["dsfs"]) for label, b in builds.items()]
        self.dsfs = self.builds[0][1]
        self.workdir, self.env, self.mnt = make_workdir("dsfs-disktier-")
        self.redis = self.proxy = self.created_data = self.tier_dir = None
        self.done_tiers = []  # removed at the end (see the module's doc)
        self.results = {"machine": machine_info(), "config": vars(args).copy(),
                        "source": builds[args.labels[0]]["source"],
                        "sources": {label: b["source"] for label, b in builds.items()},
                        "load_average": {"start": load_average()}, "cases": [],
                        "disk_dir": {"path": args.disk_dir, "filesystem": fs_type(args.disk_dir),
                                     "device": run(["df", "--output=source", args.disk_dir],
                                                   check=False).stdout.split()[-1]}}

    def start(self):
        data = prepare_dataset(self)
        self.paths = relative_paths(data)
        serve_dataset(self, data)

    def close(self):
        self.umount()
        if self.proxy:
            self.proxy.close()
        if self.redis:
            self.redis.close()
        for tier in self.done_tiers + ([self.tier_dir] if self.tier_dir else []):
            shutil.rmtree(tier, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
        remove_created_data(self.created_data, self.args.data_dir)

    def umount(self):
        unmount(self.dsfs, self.mnt, self.env)

    def stats(self):
        with open(os.path.join(self.mnt, ".dsfs", "stats.json"), "rb", buffering=0) as f:
            return json.loads(f.read())

    def read_epochs(self, reader, seed, epochs):
        """`epochs` shuffled epochs (seeds seed..seed+epochs-1) by `reader` through self.mnt."""
        a = self.args
        root = os.path.join(self.mnt, "bench")
        out_epochs = []
        if reader in ("c", "plan"):
            for e in range(epochs):
                before = counters(self.stats())
                sg0 = server_gets(self.redis.sock)
                out = os.path.join(self.workdir, "bench.json")
                run([self.dsfs, "bench", root, "--pattern", "epochs", "--epochs", 1,
                     "--jobs", JOBS, "--seed", seed + e, "--drop-caches", "--json", out,
                     "--duration", f"{a.epoch_seconds}s", *(["--plan"] if reader == "plan" else [])],
                    timeout=a.epoch_seconds + 300)
                with open(out) as f:
                    doc = json.load(f)
                if doc["errors"]["count"]:
                    raise RuntimeError(f"dsfs bench: {doc['errors']['count']} read errors")
                ep = doc["epochs"][0]
                out_epochs.append({"files": ep["files"], "seconds": ep["seconds"],
                                   "files_per_s": ep["files_per_s"],
                                   "complete": ep.get("complete", ep["files"] == len(self.paths)),
                                   "server_gets": server_gets(self.redis.sock) - sg0,
                                   **delta(before, counters(self.stats()))})
        else:
            res = subprocess.run(
                ["/usr/bin/python3", "-c", PY_READER, root, str(seed), str(JOBS),
                 str(epochs), str(a.epoch_seconds),
                 os.path.join(self.mnt, ".dsfs", "stats.json"), "", "bench/"],
                input="\n".join(self.paths), text=True, capture_output=True,
                timeout=epochs * (a.epoch_seconds + 120))
            if res.returncode != 0:
                raise RuntimeError(f"python reader failed: {res.stderr.strip()}")
            for e in json.loads(res.stdout):
                out_epochs.append({"files": e["files"], "seconds": e["seconds"],
                                   "files_per_s": e["files"] / e["seconds"],
                                   "complete": e["complete"],
                                   **delta(counters(e["stats_before"]),
                                           counters(e["stats_after"]))})
        return out_epochs

    def remount(self, mount_args, reader, seed):
        """Unmount (the tier saves its index), drop the page cache, mount again on the same tier
        directory with the same options and read one more shuffled epoch (seed `seed`)."""
        self.umount()
        if os.path.ismount(self.mnt):
            raise RuntimeError(f"{self.mnt} still mounted after dsfs umount")
        index = os.path.join(self.tier_dir, "index")
        index_bytes = os.path.getsize(index) if os.path.exists(index) else None
        du = run(["du", "-sb", self.tier_dir], check=False).stdout.split()
        drop_caches()
        t0 = time.perf_counter()
        run(mount_args, env=self.env)
        mount_s = time.perf_counter() - t0
        pid = mount_daemon_pid(self.mnt)
        cpu0 = process_usage(pid)["cpu_s"]
        s = self.stats()
        tier = s.get("disk_tier") or {}
        at_mount = counters(s)
        sg0 = server_gets(self.redis.sock)
        epoch = self.read_epochs(reader, seed, 1)[0]
        epoch.setdefault("server_gets", server_gets(self.redis.sock) - sg0)
        usage = process_usage(pid)
        # Files the engine staged from the tier between the mount and the epoch's first read
        # (builds before the warm start report none).
        staged_early = self.stats()["prefetch"].get("disk_staging", {}).get("before_first_read")
        return {**epoch, "seed": seed, "mount_seconds": mount_s,
                "index_loaded": tier.get("index_loaded"), "open_seconds": tier.get("open_seconds"),
                "tier_direct_io": tier.get("direct_io"),
                "tier_entries_at_mount": tier.get("entries"),
                "tier_bytes_used_at_mount": tier.get("bytes_used"),
                "stale_temp_files": tier.get("stale_temp_files"),
                "index_file_bytes": index_bytes,
                "tier_dir_bytes_before": int(du[0]) if du else None,
                "counters_at_mount": at_mount,
                "daemon_cpu_us_per_file": 1e6 * (usage["cpu_s"] - cpu0) / max(epoch["files"], 1),
                "daemon_hwm_bytes": usage.get("hwm_bytes"),
                "staged_before_first_read": staged_early}

    def case(self, rtt, url, mode, reader, seed, build, epochs=None, with_remount=True):
        a = self.args
        epochs_to_read = epochs or a.epochs
        cache = max(1 << 20, int(self.dataset["bytes"] * CACHE_FRACTION))
        label, dsfs = build
        args = [dsfs, "mount", self.mnt, "--redis", url, "--dataset", "bench",
                "--prefetch", "auto", "--cache-size", cache, "--timeout", "120s"]
        tier_size = None
        if mode == "disk":
            self.tier_dir = tempfile.mkdtemp(prefix="dsfs-tier-", dir=a.disk_dir)
            tier_size = disk_tier_bytes(self.dataset, a.tier_fraction)
            args += ["--disk-cache", self.tier_dir, "--disk-cache-size", tier_size]
        args += shlex.split(a.mount_options)
        t0 = time.perf_counter()
        run(args, env=self.env)
        mount_s = time.perf_counter() - t0
        epochs = []
        remount = None
        try:
            pid = mount_daemon_pid(self.mnt)
            cpu0 = process_usage(pid)["cpu_s"]
            at_mount = counters(self.stats())
            case_gets0 = server_gets(self.redis.sock)
            epochs = self.read_epochs(reader, seed, epochs_to_read)
            usage = process_usage(pid)
            at_end = counters(self.stats())
            case_server_gets = server_gets(self.redis.sock) - case_gets0
            if mode == "disk" and a.remount and with_remount:
                remount = self.remount(args, reader, seed + epochs_to_read)
        finally:
            self.umount()
            if self.tier_dir:
                du = run(["du", "-sb", self.tier_dir], check=False).stdout.split()
                tier_du = int(du[0]) if du else None
                # Kept unless the disk could not hold the next case's tier beside it.
                if shutil.disk_usage(self.tier_dir).free > 2 * (tier_du or 0) + (1 << 30):
                    self.done_tiers.append(self.tier_dir)
                else:
                    shutil.rmtree(self.tier_dir, ignore_errors=True)
                self.tier_dir = None
            else:
                tier_du = None
        files = sum(e["files"] for e in epochs)
        out = {"build": label, "rtt_ms": rtt, "mode": mode, "reader": reader, "cache_bytes": cache,
               "disk_cache_bytes": tier_size, "tier_dir_bytes_after": tier_du,
               "epochs": epochs, "counters_at_mount": at_mount, "counters_at_end": at_end,
               "server_gets_all_epochs": case_server_gets,
               "daemon_cpu_us_per_file": 1e6 * (usage["cpu_s"] - cpu0) / max(files, 1),
               "daemon_hwm_bytes": usage.get("hwm_bytes"), "mount_seconds": mount_s}
        if remount:
            out["remount_epoch"] = remount
            out["steady_files_per_s"] = steady(out)
            out["remount_ratio"] = (remount["files_per_s"] / out["steady_files_per_s"]
                                    if out["steady_files_per_s"] else None)
        return out

    def sweep(self):
        a = self.args
        for run_no in range(a.runs):
            for rtt in a.rtts:
                self.sweep_rtt(run_no, rtt)

    def sweep_rtt(self, run_no, rtt):
        a = self.args
        if rtt > 0:
            self.proxy = Proxy(self.dsfs, self.workdir, self.redis.sock, rtt)
            url = self.proxy.url
        else:
            url = self.redis.url
        if a.warm_up:
            # Not recorded: the first case after a fresh proxy (or the ingest) read its first
            # epoch slower, and the first with a tier dropped the most deferred writes.
            c = self.case(rtt, url, a.modes[-1], a.readers[0], 999, self.builds[0], epochs=1,
                          with_remount=False)
            log(f"warm-up, rtt {rtt} ms: {c['epochs'][0]['files_per_s']:.0f} files/s (not recorded)")
        for mode, reader, build in [(m, r, b) for m in a.modes for r in a.readers
                                    for b in self.builds]:
            c = self.case(rtt, url, mode, reader, 1000, build)
            c["run"] = run_no
            self.results["cases"].append(c)
            named = f"{build[0]}, " if len(self.builds) > 1 else ""
            log(f"run {run_no + 1}, {named}rtt {rtt} ms, {mode}, {reader}: epochs " + ", ".join(
                f"{e['files_per_s']:.0f}{'' if e['complete'] else ' (cut)'} files/s "
                f"[gets {e['gets']}+{e['prefetch_gets']} (server {e.get('server_gets')}), "
                f"tier hits {e['tier_hits']}, disk_reads {e['disk_reads']}]"
                for e in c["epochs"]))
            r = c.get("remount_epoch")
            if r:
                ratio = (f"{c['remount_ratio']:.2f}x steady {c['steady_files_per_s']:.0f}"
                         if c["remount_ratio"] else "no steady epoch")
                log(f"  remount: {r['files_per_s']:.0f}{'' if r['complete'] else ' (cut)'} "
                    f"files/s = {ratio} [gets {r['gets']}+{r['prefetch_gets']} "
                    f"(server {r['server_gets']}), tier hits {r['tier_hits']}, "
                    f"disk_reads {r['disk_reads']}, index_loaded {r['index_loaded']}, "
                    f"open {r['open_seconds']:.3f} s, mount {r['mount_seconds']:.2f} s, "
                    f"entries {r['tier_entries_at_mount']}, staged before the first read "
                    f"{r.get('staged_before_first_read')}]")
            self.results["remount_summary"] = remount_summary(self.results)
            self.save()
        if self.proxy:
            self.proxy.close()
            self.proxy = None

    def save(self):
        save_results(self.results, self.args.results_dir, self.args.name)


def plot(results, path):
    """Writes the plot and returns True; False (logged) where this Python has no matplotlib: the
    JSON is the result, `--report-only` plots it later with one that has."""
    try:
        import matplotlib
    except ImportError:
        log(f"no matplotlib in {sys.executable}: {path} not written")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfg = results["config"]
    readers = cfg["readers"]
    fig, axes = plt.subplots(1, len(readers), figsize=(5.5 * len(readers), 3.8), sharey=True,
                             squeeze=False)
    labels_of_builds = cfg.get("labels") or [None]
    groups = [(rtt, mode, b) for rtt in cfg["rtts"] for mode in cfg["modes"]
              for b in labels_of_builds]
    n = cfg["epochs"]
    has_remount = any(c.get("remount_epoch") for c in results["cases"])
    bars_per_group = n + (1 if has_remount else 0)
    width = 0.8 / bars_per_group
    top = 0
    for ax, reader in zip(axes[0], readers):
        for e in range(bars_per_group):
            remount = e == n
            xs, ys, labels = [], [], []
            for g, (rtt, mode, b) in enumerate(groups):
                cs = [c for c in results["cases"] if c["rtt_ms"] == rtt and c["mode"] == mode
                      and c["reader"] == reader and c.get("build") == b
                      and (c.get("remount_epoch") if remount else len(c["epochs"]) > e)]
                if remount and not cs:
                    continue
                eps = [c["remount_epoch"] if remount else c["epochs"][e] for c in cs]
                y = median([ep["files_per_s"] for ep in eps]) if eps else 0
                xs.append(g + (e - (bars_per_group - 1) / 2) * width)
                ys.append(y)
                cut = any(not ep["complete"] for ep in eps)
                label = f"{y:.0f}" + ("*" if cut else "")
                ratios = [c["remount_ratio"] for c in cs if remount and c["remount_ratio"]]
                if ratios:
                    label += "\n" + f"{median(ratios):.2f}x"
                labels.append(label)
            if not xs:
                continue
            top = max([top] + ys)
            bars = ax.bar(xs, ys, width,
                          label="after remount (x steady)" if remount else f"epoch {e + 1}",
                          **({"hatch": "//", "edgecolor": "black", "color": "white"}
                             if remount else {}))
            ax.bar_label(bars, labels, fontsize=6)
        ax.set_xticks(range(len(groups)),
                      [f"{rtt} ms\n{MODE_LABELS[mode]}" + (f"\n{b}" if len(labels_of_builds) > 1
                                                          else "")
                       for rtt, mode, b in groups], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylim(bottom=50)
        ax.set_title(f"{reader} reader, cache 25%, prefetch auto, median of "
                     f"{cfg.get('runs', 1)} run(s) (* = epoch cut)", fontsize=9)
    axes[0][0].set_ylabel("files/s")
    axes[0][0].set_ylim(top=max(top, 100) * 5)  # room for the legend above the bars
    axes[0][0].legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 200 files, RTT 0 only, 2 epochs cut after 10 s")
    p.add_argument("--build", default="build", help="build directory (build)")
    p.add_argument("--builds", default=None,
                   help="several build directories, comma-separated: each case runs with each in "
                        "turn on the same data and server (side by side; replaces --build)")
    p.add_argument("--labels", default=None,
                   help="names of the --builds in the results (default: the directories' names)")
    p.add_argument("--files", type=int, default=None, help="dataset size (2,000; --quick 200)")
    p.add_argument("--rtts", default=None, help="RTTs in ms (0,100; --quick 0)")
    p.add_argument("--runs", type=int, default=1, help="runs of every case (1); the plot shows "
                   "medians")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: redraw the plot from NAME.json")
    p.add_argument("--epochs", type=int, default=None, help="epochs per mount (3; --quick 2)")
    p.add_argument("--tier-fraction", type=float, default=1.0,
                   help="the tier's size as a fraction of what holds the whole dataset (1: all; "
                        "below 1 it evicts as it is written)")
    p.add_argument("--epoch-seconds", type=int, default=None,
                   help="cut an epoch after this long (40; --quick 10)")
    p.add_argument("--modes", default=",".join(MODES), help="none,disk")
    p.add_argument("--readers", default="c,python", help="c,python,plan (c,python)")
    p.add_argument("--disk-dir", default="/tmp",
                   help="where the tier's directory is made (/tmp; should be a real disk)")
    p.add_argument("--mount-options", default="",
                   help="more `dsfs mount` options for every mount, e.g. \"--connections 16\" "
                        "(the prefetch workers, which also stage from the tier, one read each)")
    p.add_argument("--data-dir", default="/dev/shm/dsfs-bench-data")
    p.add_argument("--keep-data", action="store_true")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="skip the unrecorded one-epoch case that precedes each RTT's cases")
    p.add_argument("--no-remount", dest="remount", action="store_false",
                   help="disk mode: skip the remount epoch (unmount, mount again on the same tier "
                   "directory, one more shuffled epoch)")
    p.add_argument("--name", default="disk_tier", help="results are NAME.json, NAME.png "
                   "(disk_tier)")
    p.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = p.parse_args()
    if args.report_only:
        with open(os.path.join(args.results_dir, f"{args.name}.json")) as f:
            plot(json.load(f), os.path.join(args.results_dir, f"{args.name}.png"))
        return
    require_root()
    args.builds = (args.builds or args.build).split(",")
    args.labels = (args.labels.split(",") if args.labels
                   else [os.path.basename(os.path.normpath(b)) for b in args.builds])
    if len(args.labels) != len(args.builds) or len(set(args.labels)) != len(args.labels):
        sys.exit("bench: --labels needs one distinct name per build of --builds")
    q = args.quick
    args.files = args.files or (200 if q else 2000)
    args.rtts = [int(x) for x in (args.rtts or ("0" if q else "0,100")).split(",")]
    args.epochs = args.epochs or (2 if q else 3)
    args.epoch_seconds = args.epoch_seconds or (10 if q else 40)
    args.modes = args.modes.split(",")
    args.readers = args.readers.split(",")
    check_choices(args.readers, ("c", "python", "plan"), "reader")
    interrupt_on_signals()
    bench = Bench(args)
    bench.results["wall_s"] = round(run_bench(bench), 1)
    bench.save()
    png = os.path.join(args.results_dir, f"{args.name}.png")
    plotted = plot(bench.results, png)
    log(f"results: {args.results_dir}/{args.name}.json{', ' + png if plotted else ''} "
        f"({bench.results['wall_s']} s)")


if __name__ == "__main__":
    main()
