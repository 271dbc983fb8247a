#!/usr/bin/python3
"""The side-by-side read-path benchmark: dsfs against tmpfs and raw Redis, cold and warm, through
an emulated WAN (dsfs proxy), with fio and a PyTorch DataLoader, in one run on one machine.

    bench/run.sh [--quick] [--build DIR] [--files N] [--repeats R] [--name NAME] [--no-docs]

Steps: synthesize an ImageNet-like dataset straight into tmpfs (`dsfs synth`, kept between runs),
start a private redis-server on a unix socket and ingest it, then measure every case `--repeats`
times with `dsfs bench --pattern epochs --jobs 8` and report medians. Writes
bench/results/NAME.json, NAME-cases.png, NAME-rtt.png and (unless --quick or --no-docs) the
generated section of docs/benchmarks.md. Needs root (mounts, drop_caches).
"""
import argparse
import json
import os
import re
import shutil
import sys
import time

from common import (REPO, Proxy, RedisServer, build_binary, drop_caches, ingest, log, machine_info,
                    make_workdir, median, run, synth_dataset, tree_info, update_docs_section)

H100_SAMPLES_PER_S = 1786  # MLPerf Storage ResNet-50: one H100 at full speed
UTILIZATION_BAR = 0.9
JOBS = 8
DOCS_START = "<!-- bench/run.py read_path: start -->"
DOCS_END = "<!-- bench/run.py read_path: end -->"


class Bench:
    def __init__(self, args):
        self.args = args
        self.dsfs = build_binary(args.build)
        self.redis_raw = build_binary(args.build, os.path.join("bench", "dsfs_bench_redis_raw"))
        self.workdir, self.env, self.mnt = make_workdir("dsfs-bench-")
        self.redis = None
        self.results = {"machine": machine_info(), "config": vars(args).copy(), "cases": {}}

    # ---- setup ----

    def dataset(self):
        """The synthetic dataset in tmpfs, reused when a complete one with these settings exists."""
        data, _ = synth_dataset(self.dsfs, self.args.data_dir, self.args.files)
        self.results["dataset"] = tree_info(data)
        return data

    def start(self):
        self.data = self.dataset()
        self.redis = RedisServer(self.workdir)
        log(f"ingesting {self.data} into {self.redis.url}")
        ingest(self.dsfs, self.data, self.redis.url, self.env)

    def close(self):
        self.umount()
        if self.redis:
            self.redis.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- mounts ----

    def mount(self, url, *extra):
        cache = max(1 << 30, 2 * self.results["dataset"]["bytes"])
        if "--cache-size" not in extra:
            extra = ("--cache-size", str(cache), *extra)
        # This suite measures the read path itself; bench/prefetch.py measures fetching ahead.
        if "--prefetch" not in extra:
            extra = ("--prefetch", "off", *extra)
        run([self.dsfs, "mount", self.mnt, "--redis", url, "--dataset", "bench", *extra],
            env=self.env)
        return os.path.join(self.mnt, "bench")

    def umount(self):
        if os.path.ismount(self.mnt):
            run([self.dsfs, "umount", self.mnt], env=self.env, check=False)

    def stats(self):
        with open(os.path.join(self.mnt, ".dsfs", "stats.json")) as f:
            return json.load(f)

    # ---- measurements ----

    def dsfs_bench(self, path, *extra, epochs=1, seed=0):
        out = os.path.join(self.workdir, "bench.json")
        run([self.dsfs, "bench", path, "--pattern", "epochs", "--jobs", JOBS, "--epochs", epochs,
             "--seed", seed, "--json", out, *extra])
        with open(out) as f:
            return json.load(f)

    @staticmethod
    def figure(report):
        t = report["totals"]
        return {"files_per_s": t["files_per_s"], "mb_per_s": t["mb_per_s"], "files": t["files"],
                "errors": t["errors"], "p50_ms": t["latency_ms"]["p50"],
                "p99_ms": t["latency_ms"]["p99"]}

    def record(self, case, runs, **extra):
        rates = [r["files_per_s"] for r in runs]
        entry = {"median_files_per_s": median(rates), "min_files_per_s": min(rates),
                 "max_files_per_s": max(rates),
                 "median_mb_per_s": median([r["mb_per_s"] for r in runs]),
                 "median_p50_ms": median([r["p50_ms"] for r in runs]),
                 "median_p99_ms": median([r["p99_ms"] for r in runs]), "runs": runs}
        entry.update(extra)
        self.results["cases"][case] = entry
        log(f"{case}: {entry['median_files_per_s']:.0f} files/s "
            f"(min {entry['min_files_per_s']:.0f}, max {entry['max_files_per_s']:.0f})")

    def measure_tmpfs(self):
        runs = []
        for rep in range(self.args.repeats):
            runs.append(self.figure(self.dsfs_bench(self.data, seed=rep)))
        self.record("tmpfs", runs)

    def measure_raw_redis(self):
        runs = []
        for rep in range(self.args.repeats):
            out = os.path.join(self.workdir, "raw.json")
            run([self.redis_raw, "--redis", self.redis.url, "--dataset", "bench", "--pattern",
                 "epochs", "--jobs", JOBS, "--pipeline", 4, "--seed", rep, "--json", out])
            with open(out) as f:
                runs.append(self.figure(json.load(f)))
        self.record("raw_redis", runs)

    def measure_dsfs_states(self):
        """cold (fresh mount, empty caches), dsfs-warm (kernel caches dropped, objects in dsfs's
        cache) and warm (second epoch, page cache), with the FUSE requests each costs per file."""
        phases = {"dsfs_cold": [], "dsfs_dsfs_warm": [], "dsfs_warm": []}
        requests = {name: [] for name in phases}
        for rep in range(self.args.repeats):
            path = self.mount(self.redis.url)
            try:
                drop_caches()
                for name in phases:
                    if name == "dsfs_dsfs_warm":
                        drop_caches()
                    before = self.stats()
                    report = self.dsfs_bench(path, seed=rep * 10 + len(phases[name]))
                    after = self.stats()
                    phases[name].append(self.figure(report))
                    requests[name].append(request_profile(before, after, report["totals"]["files"]))
            finally:
                self.umount()
        for name, runs in phases.items():
            self.record(name, runs, fuse_requests_per_file=requests[name][-1])

    def measure_dsfs_cold_bounded_cache(self):
        """Cold again, but with a cache far smaller than the dataset, as in training on a big
        one: once full, each fetch reuses memory of an evicted object instead of touching new
        pages (a fresh page costs a fault, zeroing and a memory-cgroup charge)."""
        runs = []
        for rep in range(self.args.repeats):
            path = self.mount(self.redis.url, "--cache-size", "256MiB")
            try:
                drop_caches()
                runs.append(self.figure(self.dsfs_bench(path, seed=rep)))
            finally:
                self.umount()
        self.record("dsfs_cold_cache_256MiB", runs)

    def measure_rtt(self):
        for rtt in self.args.rtts:
            proxy = Proxy(self.dsfs, self.workdir, self.redis.sock, rtt)
            runs = []
            try:
                for rep in range(self.args.repeats):
                    path = self.mount(proxy.url, "--timeout", "120s")
                    try:
                        drop_caches()
                        report = self.dsfs_bench(path, "--duration", f"{self.args.rtt_seconds}s",
                                                 seed=rep)
                        runs.append(self.figure(report))
                    finally:
                        self.umount()
            finally:
                proxy.close()
            expected = JOBS / (rtt / 1000.0) if rtt > 0 else None
            self.record(f"dsfs_cold_proxy_rtt_{rtt}ms", runs, rtt_ms=rtt,
                        jobs_over_rtt=expected)

    def measure_profile(self):
        if not shutil.which("perf") or self.args.no_profile:
            return
        profiles = {}
        path = self.mount(self.redis.url)
        daemon = run(["pgrep", "-f", f"mount {self.mnt}"], check=False).stdout.split()
        try:
            for name in ("cold", "dsfs_warm"):
                drop_caches()
                data = os.path.join(self.workdir, f"perf-{name}.data")
                run(["perf", "record", "-a", "-g", "-o", data, "--", self.dsfs, "bench", path,
                     "--pattern", "epochs", "--jobs", JOBS, "--seed", 99])
                # perf attributes samples to threads: the daemon is all of its threads.
                tids = os.listdir(f"/proc/{daemon[0]}/task") if daemon else []
                profiles[name] = perf_summary(data, set(tids))
        finally:
            self.umount()
        self.results["profile"] = profiles

    def measure_fio(self):
        if not shutil.which("fio") or self.args.no_fio:
            return
        results = {}
        for jobs in self.args.fio_jobs:
            jobfile = os.path.join(REPO, "bench", "fio", f"whole-files-{jobs}jobs.fio")
            for target in ("tmpfs", "dsfs_cold", "dsfs_warm"):
                results.setdefault(f"{target}_{jobs}jobs", [])
            for rep in range(self.args.repeats):
                results[f"tmpfs_{jobs}jobs"].append(self.fio(jobfile, self.data))
                path = self.mount(self.redis.url)
                try:
                    drop_caches()
                    results[f"dsfs_cold_{jobs}jobs"].append(self.fio(jobfile, path))
                    results[f"dsfs_warm_{jobs}jobs"].append(self.fio(jobfile, path))
                finally:
                    self.umount()
        self.results["fio"] = {
            name: {"median_files_per_s": median([r["files_per_s"] for r in runs]),
                   "median_mb_per_s": median([r["mb_per_s"] for r in runs]),
                   "median_clat_p99_ms": median([r["clat_p99_ms"] for r in runs]), "runs": runs}
            for name, runs in results.items()}
        for name, r in self.results["fio"].items():
            log(f"fio {name}: {r['median_files_per_s']:.0f} files/s, "
                f"{r['median_mb_per_s']:.0f} MB/s")

    def fio(self, jobfile, data):
        env = dict(os.environ, DSFS_FIO_DATA=data)
        res = run(["fio", jobfile, "--output-format=json"], env=env)
        report = json.loads(res.stdout[res.stdout.index("{"):])
        jobs = report["jobs"]
        # The jobs run side by side: the slowest one's runtime is the run's.
        runtime_s = max(j["read"]["runtime"] for j in jobs) / 1000.0
        io_bytes = sum(j["read"]["io_bytes"] for j in jobs)
        files = count_files(report)
        return {"files_per_s": files / runtime_s if runtime_s else 0.0,
                "mb_per_s": io_bytes / runtime_s / 1e6 if runtime_s else 0.0,
                "iops": sum(j["read"]["iops"] for j in jobs),
                "clat_p99_ms": max(j["read"]["clat_ns"].get("percentile", {}).get("99.000000", 0)
                                   for j in jobs) / 1e6}

    def measure_torch(self):
        if self.args.no_torch:
            return
        results = {}
        script = os.path.join(REPO, "tools", "python", "read_epoch.py")
        for mode, limit in (("raw", self.args.torch_raw_images),
                            ("decode", self.args.torch_decode_images)):
            for target in ("tmpfs", "dsfs"):
                rates = []
                for rep in range(self.args.repeats):
                    out = os.path.join(self.workdir, "torch.json")
                    root = self.data
                    if target == "dsfs":
                        root = self.mount(self.redis.url)
                        drop_caches()
                    try:
                        run(["/usr/bin/python3", script, root, f"--{mode}", "--workers", 4,
                             "--limit", limit, "--seed", rep, "--json", out])
                    finally:
                        if target == "dsfs":
                            self.umount()
                    with open(out) as f:
                        rates.append(json.load(f)["epochs"][0]["images_per_s"])
                results[f"{target}_{mode}"] = {"median_images_per_s": median(rates),
                                               "images": limit, "runs": rates}
                log(f"DataLoader {target} {mode}: {median(rates):.0f} images/s")
        self.results["dataloader"] = results

    def summarize(self):
        c = self.results["cases"]

        def rate(name):
            return c.get(name, {}).get("median_files_per_s", 0.0)

        def ratio(a, b):
            return rate(a) / rate(b) if rate(b) else None

        self.results["ratios"] = {
            "warm_over_tmpfs": ratio("dsfs_warm", "tmpfs"),
            "dsfs_warm_over_tmpfs": ratio("dsfs_dsfs_warm", "tmpfs"),
            "cold_over_tmpfs": ratio("dsfs_cold", "tmpfs"),
            "cold_over_dsfs_warm": ratio("dsfs_cold", "dsfs_dsfs_warm"),
            "cold_over_raw_redis": ratio("dsfs_cold", "raw_redis"),
            "cold_256MiB_over_dsfs_warm": ratio("dsfs_cold_cache_256MiB", "dsfs_dsfs_warm"),
        }
        # On one machine a cold read costs what Redis spends serving it plus what the FUSE path
        # spends delivering it; if those simply add, cold files/s cannot exceed this.
        raw, fuse = rate("raw_redis"), rate("dsfs_dsfs_warm")
        bound = 1.0 / (1.0 / raw + 1.0 / fuse) if raw and fuse else None
        self.results["ratios"]["additive_cold_bound_files_per_s"] = bound
        self.results["ratios"]["cold_256MiB_over_additive_bound"] = (
            rate("dsfs_cold_cache_256MiB") / bound if bound else None)
        fed = {}
        for name, entry in c.items():
            fed[name] = int(entry["median_files_per_s"] // (H100_SAMPLES_PER_S * UTILIZATION_BAR))
        for name, entry in self.results.get("dataloader", {}).items():
            fed[f"dataloader_{name}"] = int(entry["median_images_per_s"] //
                                            (H100_SAMPLES_PER_S * UTILIZATION_BAR))
        self.results["h100s_fed_at_90pct"] = fed


def count_files(report):
    """Files fio read: its jobs each read one class directory, every file once."""
    total = 0
    for job in report["jobs"]:
        opendir = job.get("job options", {}).get("opendir", "")
        if opendir and os.path.isdir(opendir):
            total += len(os.listdir(opendir))
    return total


def request_profile(before, after, files):
    """FUSE requests per file read between two stats.json snapshots (less the one read of
    `before` itself)."""
    per_file = {}
    for op, n in after["requests"].items():
        delta = n - before["requests"].get(op, 0) - (1 if op == "read" else 0)
        if op == "lookup":
            delta -= 1  # the lookup of stats.json that rendered `after`
        if delta > 0:
            per_file[op] = round(delta / max(files, 1), 3)
    per_file["total"] = round(sum(per_file.values()), 3)
    per_file["redis_gets"] = round((after["redis_ops"]["gets"] - before["redis_ops"]["gets"]) /
                                   max(files, 1), 3)
    return per_file


def perf_summary(data, daemon_tids):
    """Where the CPU went: share of samples per process (the dsfs daemon told apart from the
    `dsfs bench` reader, which has the same name), and the daemon's top symbols."""
    by_pid = run(["perf", "report", "-i", data, "--no-children", "--sort", "pid", "--stdio",
                  "-g", "none", "-q"], check=False).stdout
    shares = {}
    for line in by_pid.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\d+):(\S.*?)\s*$", line)
        if not m:
            continue
        tid, name = m.group(2), m.group(3)
        if name == "dsfs":
            name = "dsfs daemon" if tid in daemon_tids else "dsfs bench (the reader)"
        shares[name] = shares.get(name, 0.0) + float(m.group(1))
    comms = [{"process": k, "percent": round(v, 2)}
             for k, v in sorted(shares.items(), key=lambda kv: -kv[1])]
    only = ["--tid", ",".join(sorted(daemon_tids))] if daemon_tids else ["--comms", "dsfs"]
    by_sym = run(["perf", "report", "-i", data, "--no-children", "--percentage", "relative",
                  *only, "--sort", "sym", "--stdio", "-g", "none", "-q"], check=False).stdout
    symbols = []
    for line in by_sym.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*)$", line)
        if m and len(symbols) < 15:
            symbols.append({"percent": float(m.group(1)),
                            "where": "kernel" if m.group(2) == "k" else "user",
                            "symbol": m.group(3).strip()[:120]})
    return {"by_process": comms[:10], "dsfs_top_symbols": symbols}


def plot(results, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    order = ["tmpfs", "raw_redis", "dsfs_warm", "dsfs_dsfs_warm", "dsfs_cold",
             "dsfs_cold_cache_256MiB"]
    order += sorted((k for k in cases if k.startswith("dsfs_cold_proxy")),
                    key=lambda k: cases[k]["rtt_ms"])
    names = [n for n in order if n in cases]
    med = [cases[n]["median_files_per_s"] for n in names]
    low = [m - cases[n]["min_files_per_s"] for n, m in zip(names, med)]
    high = [cases[n]["max_files_per_s"] - m for n, m in zip(names, med)]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    ax.bar(range(len(names)), med, yerr=[low, high], capsize=3, color="#4c72b0")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace("dsfs_cold_proxy_rtt_", "proxy ") for n in names],
                       rotation=30, ha="right")
    ax.set_ylabel("files/s (median, min-max)")
    ax.set_yscale("log")
    ax.set_title(f"dsfs bench --pattern epochs --jobs {JOBS}: "
                 f"{results['dataset']['files']} files, mean "
                 f"{results['dataset']['mean_file_bytes'] / 1000:.0f} KB, no prefetching")
    fig.tight_layout()
    fig.savefig(f"{prefix}-cases.png", dpi=110)
    plt.close(fig)

    rtt = [(cases[k]["rtt_ms"], cases[k]["median_files_per_s"]) for k in cases
           if k.startswith("dsfs_cold_proxy")]
    if rtt:
        rtt.sort()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r for r, _ in rtt], [v for _, v in rtt], "o-", label="dsfs cold, no prefetch")
        xs = [r for r, _ in rtt if r > 0]
        ax.plot(xs, [JOBS / (r / 1000) for r in xs], "--", color="gray",
                label=f"jobs/RTT ({JOBS} readers, one file per round trip)")
        if "tmpfs" in cases:
            ax.axhline(cases["tmpfs"]["median_files_per_s"], color="green", linestyle=":",
                       label="tmpfs")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
        ax.set_xlabel("emulated RTT to Redis (ms, dsfs proxy)")
        ax.set_ylabel("files/s")
        ax.legend()
        ax.set_title("Throughput against RTT without prefetching")
        fig.tight_layout()
        fig.savefig(f"{prefix}-rtt.png", dpi=110)
        plt.close(fig)


def markdown(results, name):
    c = results["cases"]
    m = results["machine"]
    d = results["dataset"]
    tmpfs = c.get("tmpfs", {}).get("median_files_per_s", 0)
    lines = [DOCS_START, "",
             f"Generated by `bench/run.sh` on {m['date']}: {m['cpus']} CPUs ({m['cpu_model']}), "
             f"{m['memory_gib']} GiB, Linux {m['kernel']}. Dataset: {d['files']} synthetic "
             f"JPEGs, mean {d['mean_file_bytes'] / 1000:.0f} KB, in tmpfs; Redis, dsfs and the "
             f"reader share the machine. `dsfs bench --pattern epochs --jobs {JOBS}`, median of "
             f"{results['config']['repeats']} runs. No prefetching (that is issue 4).", "",
             "| case | files/s | MB/s | p50 ms | p99 ms | vs tmpfs | FUSE requests per file |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for case, entry in c.items():
        req = entry.get("fuse_requests_per_file")
        req_text = ", ".join(f"{k} {v}" for k, v in req.items()) if req else ""
        vs = f"{entry['median_files_per_s'] / tmpfs:.2f}" if tmpfs else ""
        lines.append(f"| {case} | {entry['median_files_per_s']:.0f} | "
                     f"{entry['median_mb_per_s']:.0f} | {entry['median_p50_ms']:.2f} | "
                     f"{entry['median_p99_ms']:.2f} | {vs} | {req_text} |")
    r = results["ratios"]

    def pct(v):
        return f"{100 * v:.0f}%" if v is not None else "n/a"

    lines += ["", f"Ratios: warm/tmpfs {pct(r['warm_over_tmpfs'])}, dsfs-warm/tmpfs "
              f"{pct(r['dsfs_warm_over_tmpfs'])}, cold/tmpfs {pct(r['cold_over_tmpfs'])}, "
              f"cold/dsfs-warm {pct(r['cold_over_dsfs_warm'])}, cold/raw Redis "
              f"{pct(r['cold_over_raw_redis'])}; with a 256 MiB cache (memory reused once "
              f"full) cold/dsfs-warm {pct(r['cold_256MiB_over_dsfs_warm'])}. If Redis's cost "
              f"per GET (raw Redis case) and the FUSE path's cost per file (dsfs-warm case) "
              f"simply add on these shared cores, cold reads cannot exceed "
              f"{(r['additive_cold_bound_files_per_s'] or 0):.0f} files/s; the 256 MiB cold "
              f"case reaches {pct(r['cold_256MiB_over_additive_bound'])} of that.", ""]
    if "fio" in results:
        lines += ["fio (`bench/fio/whole-files-*jobs.fio`: each job reads every file of its own "
                  "class folder once, 16 KiB reads, each file up to the mean file size):", "",
                  "| fio case | files/s | MB/s | clat p99 ms |", "|---|---:|---:|---:|"]
        for case, entry in results["fio"].items():
            lines.append(f"| {case} | {entry['median_files_per_s']:.0f} | "
                         f"{entry['median_mb_per_s']:.0f} | {entry['median_clat_p99_ms']:.2f} |")
        lines.append("")
    if "dataloader" in results:
        lines += ["PyTorch DataLoader over torchvision ImageFolder (4 workers, shuffled, "
                  "`tools/python/read_epoch.py`; `raw` reads bytes, `decode` runs the ImageNet "
                  "eval transform):", "", "| loader case | images/s | H100s fed at 90% |",
                  "|---|---:|---:|"]
        for case, entry in results["dataloader"].items():
            lines.append(f"| {case} | {entry['median_images_per_s']:.0f} | "
                         f"{results['h100s_fed_at_90pct'].get('dataloader_' + case, 0)} |")
        lines.append("")
    rtt_cases = sorted((e["rtt_ms"], e) for k, e in c.items() if k.startswith("dsfs_cold_proxy"))
    if rtt_cases:
        parts = [f"{e['median_files_per_s']:.0f} files/s at {r} ms" +
                 (f" (jobs/RTT = {e['jobs_over_rtt']:.0f})" if e.get("jobs_over_rtt") else "")
                 for r, e in rtt_cases]
        lines += ["**Without prefetching, a far Redis starves the loader.** Each of the "
                  f"{JOBS} readers waits one round trip per file, so files/s falls as jobs/RTT: "
                  + "; ".join(parts) + ". Hiding that latency by fetching ahead, many requests "
                  "in flight, is what the prefetch engine (issue 4) is for.", ""]
    fed = results["h100s_fed_at_90pct"]
    lines += [f"MLPerf-Storage-style: H100s training ResNet-50 ({H100_SAMPLES_PER_S} samples/s "
              f"each) fed at 90% utilization by the `dsfs bench` rates: " +
              ", ".join(f"{k} {v}" for k, v in fed.items() if not k.startswith("dataloader")) +
              ".", ""]
    if "profile" in results:
        for phase, prof in results["profile"].items():
            procs = ", ".join(f"{p['process']} {p['percent']:.0f}%" for p in prof["by_process"][:6])
            syms = "; ".join(f"{s['symbol'][:40]} {s['percent']:.1f}%"
                             for s in prof["dsfs_top_symbols"][:6])
            lines.append(f"CPU profile ({phase} epoch, `perf record -a`, share of samples): "
                         f"{procs}. Top symbols of the dsfs daemon (share of its own samples): "
                         f"{syms}.")
        lines.append("")
    lines += [f"![throughput per case](../bench/results/{name}-cases.png)", "",
              f"![throughput against RTT](../bench/results/{name}-rtt.png)", "",
              f"Data: `bench/results/{name}.json`. Rerun: `bench/run.sh` (about "
              f"{results.get('elapsed_minutes', 0):.0f} minutes here), or "
              "`bench/run.sh --quick` for a smoke run.", "", DOCS_END]
    return "\n".join(lines)


def update_docs(text):
    update_docs_section(DOCS_START, DOCS_END, "## Read path, without prefetching (`bench/run.sh`)",
                        text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a small smoke run (1,000 files, RTT 0 and 10 ms, short cases)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="build directory")
    ap.add_argument("--files", type=int, help="dataset size (default 20,000; --quick 1,000)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    ap.add_argument("--rtts", type=lambda s: [int(x) for x in s.split(",")],
                    help="emulated RTTs in ms (default 0,1,10,50,100; --quick 0,10)")
    ap.add_argument("--rtt-seconds", type=float, help="seconds per RTT run (default 10; quick 2)")
    ap.add_argument("--fio-jobs", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 4, 8], help="fio job counts (job files bench/fio/)")
    ap.add_argument("--data-dir", default="/dev/shm/dsfs-bench",
                    help="tmpfs directory for the synthetic dataset (kept between runs)")
    ap.add_argument("--name", help="results name (default read_path; --quick read_path_quick)")
    ap.add_argument("--no-profile", action="store_true", help="skip the perf profile")
    ap.add_argument("--no-fio", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"),
                    help="where NAME.json and the plots go")
    args = ap.parse_args()
    args.files = args.files or (1000 if args.quick else 20000)
    args.rtts = args.rtts or ([0, 10] if args.quick else [0, 1, 10, 50, 100])
    args.rtt_seconds = args.rtt_seconds or (2 if args.quick else 10)
    args.name = args.name or ("read_path_quick" if args.quick else "read_path")
    args.torch_raw_images = min(args.files, 500 if args.quick else 10000)
    args.torch_decode_images = min(args.files, 200 if args.quick else 2000)
    if args.quick:
        args.fio_jobs = [4]
    if os.geteuid() != 0:
        sys.exit("bench: needs root (FUSE mounts and /proc/sys/vm/drop_caches)")

    started = time.time()
    bench = Bench(args)
    try:
        bench.start()
        bench.measure_tmpfs()
        bench.measure_raw_redis()
        bench.measure_dsfs_states()
        bench.measure_dsfs_cold_bounded_cache()
        bench.measure_rtt()
        bench.measure_fio()
        bench.measure_torch()
        bench.measure_profile()
        bench.summarize()
    finally:
        bench.close()
    results = bench.results
    results["elapsed_minutes"] = (time.time() - started) / 60
    out_dir = args.results_dir
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, args.name)
    with open(prefix + ".json", "w") as f:
        json.dump(results, f, indent=2)
    plot(results, prefix)
    text = markdown(results, args.name)
    print(text)
    if not args.quick and not args.no_docs:
        update_docs(text)
        log("updated docs/benchmarks.md")
    log(f"wrote {prefix}.json and its plots in {results['elapsed_minutes']:.1f} minutes")


if __name__ == "__main__":
    main()
