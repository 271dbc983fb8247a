#!/usr/bin/python3
"""The first epoch on a fresh mount (issue 17): files/s for `--prefetch auto`, `off` and a
written plan, with the object cache at 25%, 100% and 200% of the dataset's bytes, next to the
server and through `dsfs proxy` at 10 and 100 ms, read by the C bench and by a Python reader,
with raw pipelined Redis GETs beside them. One or more builds side by side in one run.

    bench/first_epoch.py [--quick] [--builds build[,build-before]] [--labels after,before]

Synthesizes an ImageNet-like dataset (`dsfs synth`, tmpfs), ingests it into a private
redis-server on a unix socket, then for every RTT (0: the server's socket itself, as the
embedded default reads it; 10, 100: through `dsfs proxy --rtt`), run, cache size, mode, reader
and build, in that nesting (builds interleaved, so load drifts hit them alike, in alternating
order from run to run; modes taking turns going first), after one epoch per RTT that is not
recorded (the first daemon to take memory pays for fresh pages):

  mount    `dsfs mount --dataset bench --prefetch auto|off --cache-size F x data`, fresh
  reader   c:      `dsfs bench M/bench --pattern epochs --epochs 1 --jobs 8 --drop-caches`
                   (`--plan` for the plan mode: the epoch's order written to M/.dsfs/plan first;
                   `--pattern seq` for the sequential order)
           python: 8 threads, a shuffled order (or the sorted one: thread i reads files i,
                   i + 8, ...), `open(p, "rb").read()` per file (open, fstat,
                   read to EOF, close: what PIL and most loaders do); page cache dropped first;
                   the plan mode writes the order to M/.dsfs/plan before the clock starts
           processes: the same in 8 forked processes (as DataLoader workers are), no GIL
                   shared between them (not in the default --readers)
  order    shuffled (a new permutation, as a shuffling sampler), sequential (the files in
           sorted order, as a loader without shuffling, `tar` or `md5sum`) or random (as many
           draws as files, with replacement, as `RandomSampler(replacement=True)` or a
           `WeightedRandomSampler`; Python readers only): `--orders`
  figures  files/s, the daemon's CPU per file and RSS (VmRSS at the end, VmHWM), its CPU per
           thread name (fetch-N, disk-write-N, ...; FUSE's workers keep the daemon's name) and
           its busiest thread's CPU as a share of the epoch (near 100%: that thread bounds the
           epoch), reads found ready / joined / missed, GETs, the in-flight peak and fetches
           sent with the window open for a plan (stats.json)

and `dsfs_bench_redis_raw` (8 threads, 4 pipelined GETs each, no FUSE, no cache) at each RTT:
what Redis itself serves to the same number of readers. An epoch longer than --epoch-seconds is
cut there, by either reader (prefetching off at 100 ms: 80 files/s); its files/s is still the
rate.

Writes bench/results/NAME.json and NAME.png, and (unless --quick or --no-docs) the generated
section of docs/benchmarks.md. Needs root (mounts, drop_caches). Everything it starts is removed
on exit, Ctrl-C included.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, Proxy, check_choices, close_bench, drop_caches,  # noqa: E402
                    find_builds, interrupt_on_signals, load_average, log, machine_info,
                    make_workdir, median, mount_daemon_pid, prepare_dataset, process_usage,
                    publish_results, relative_paths, require_root, run, run_bench, save_results,
                    serve_dataset, split_builds, thread_cpu, unmount)
from prefetch import stats_delta  # noqa: E402

DOCS_START = "<!-- first_epoch.py: start -->"
DOCS_END = "<!-- first_epoch.py: end -->"
DOCS_HEADING = "## The first epoch (issue 17, `bench/first_epoch.py`)"
JOBS = 8
MODES = OrderedDict([("off", {"prefetch": "off", "plan": False}),
                     ("auto", {"prefetch": "auto", "plan": False}),
                     ("plan", {"prefetch": "auto", "plan": True})])
READERS = ("c", "python", "processes")
ORDERS = ("shuffled", "sequential", "random")
DEFAULT_READERS = ("c", "python")

# A fresh interpreter per epoch; prints the files read and the seconds taken. argv: root, seed,
# plan file or "" (no plan), readers, seconds after which the epoch is cut, "threads" or
# "processes" (forked after the list is read, each writing its count to a pipe), "shuffled",
# "sequential" (the sorted list as it comes) or "random" (len(files) draws with replacement).
PY_READER = r"""
import os, random, sys, threading, time
root, seed, plan, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
limit = float(sys.argv[5])
forked = sys.argv[6] == "processes"
files = [l for l in sys.stdin.read().split("\n") if l]
if sys.argv[7] == "shuffled":
    random.Random(seed).shuffle(files)
elif sys.argv[7] == "random":
    files = random.Random(seed).choices(files, k=len(files))
if plan:
    mount = os.path.dirname(root)
    with open(plan, "w") as f:
        f.write("".join(os.path.relpath(os.path.join(root, p), mount) + "\n" for p in files))
errors = []
done = [0] * threads
def reader(i):
    try:
        for p in files[i::threads]:
            if time.perf_counter() - start > limit:
                return
            with open(os.path.join(root, p), "rb") as f:
                f.read()
            done[i] += 1
    except OSError as e:
        errors.append(e)
start = time.perf_counter()
if forked:
    children = []
    for i in range(threads):
        out, into = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(out)
                reader(i)
                os.write(into, f"{done[i]} {len(errors)}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(into)
        children.append((pid, out))
    for i, (pid, out) in enumerate(children):
        text = os.read(out, 100).decode().split()
        os.waitpid(pid, 0)
        if len(text) != 2 or text[1] != "0":
            errors.append(f"reader process {pid} failed")
        else:
            done[i] = int(text[0])
else:
    workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
    for t in workers: t.start()
    for t in workers: t.join()
elapsed = time.perf_counter() - start
if errors: sys.exit(f"read failed: {errors[0]}")
print(sum(done), elapsed)
"""


# --syscalls: the kinds of syscall a read path makes, and the scheduler's and memory's events.
COUNTED_EVENTS = [f"syscalls:sys_enter_{name}" for name in (
    "read", "readv", "write", "writev", "pread64", "recvfrom", "recvmsg", "sendto", "sendmsg",
    "splice", "vmsplice", "futex", "madvise", "mmap", "munmap", "mprotect", "brk", "poll",
    "ppoll", "epoll_wait", "epoll_pwait", "openat", "close", "newfstatat", "statx",
    "lseek", "ioctl", "getdents64", "fadvise64", "clock_nanosleep", "sched_yield",
    "io_uring_enter")] + ["context-switches", "cpu-migrations", "page-faults"]


class Bench:
    def __init__(self, args):
        self.args = args
        self.builds = find_builds(args.builds, args.labels)
        self.dsfs = self.builds[args.labels[0]]["dsfs"]
        self.raw = os.path.abspath(os.path.join(args.builds[0], "bench", "dsfs_bench_redis_raw"))
        if not os.access(self.raw, os.X_OK):
            sys.exit(f"bench: {self.raw} is missing; build first")
        self.workdir, self.env, self.mnt = make_workdir("dsfs-first-epoch-")
        self.redis = self.proxy = self.created_data = None
        self.results = {"machine": machine_info(), "config": vars(args).copy(),
                        "builds": {k: v["source"] for k, v in self.builds.items()},
                        "load_average": {"start": load_average()}, "cases": [], "raw": []}

    # ---- setup and teardown ----

    def start(self):
        data = prepare_dataset(self)
        self.paths = relative_paths(data)
        serve_dataset(self, data)

    def close(self):
        close_bench(self)

    def url_for(self, rtt):
        """The server's own socket at 0 ms; otherwise a proxy adding `rtt` ms."""
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        if rtt == 0:
            return self.redis.url
        self.proxy = Proxy(self.dsfs, self.workdir, self.redis.sock, rtt)
        return self.proxy.url

    def umount(self):
        # --wait 60s: a daemon still draining replies must not fail the next mount
        unmount(self.dsfs, self.mnt, self.env, "--wait", "60s")

    def stats(self):
        # buffering=0: no isatty() ioctl counted in the figures it reads
        with open(os.path.join(self.mnt, ".dsfs", "stats.json"), "rb", buffering=0) as f:
            return json.loads(f.read())

    # ---- one first epoch ----

    def epoch(self, build, url, mode, cache_fraction, reader, order, seed, profile_name=None):
        """One first epoch; with `profile_name`, profiled (--perf) under that name."""
        spec = MODES[mode]
        cache = max(1 << 20, int(self.dataset["bytes"] * cache_fraction))
        run([build["dsfs"], "mount", self.mnt, "--redis", url, "--dataset", "bench", "--prefetch",
             spec["prefetch"], "--cache-size", cache, "--timeout", "120s"], env=self.env)
        try:
            root = os.path.join(self.mnt, "bench")
            pid = mount_daemon_pid(self.mnt)
            before = self.stats()
            start = process_usage(pid)
            profile = self.start_profile(profile_name, pid) if profile_name else None
            counting = self.start_counting(pid) if self.args.syscalls else None
            proxy_start = process_usage(self.proxy.proc.pid)["cpu_s"] if self.proxy else 0
            if reader == "c":
                out = os.path.join(self.workdir, "bench.json")
                pattern = "epochs" if order == "shuffled" else "seq"
                args = [build["dsfs"], "bench", root, "--pattern", pattern, "--jobs", JOBS,
                        "--epochs", 1, "--seed", seed, "--drop-caches", "--json", out,
                        "--duration", f"{self.args.epoch_seconds}s"]
                if spec["plan"]:
                    args.append("--plan")
                run(self.counted(args), timeout=600)
                with open(out) as f:
                    e = json.load(f)["epochs"][0]
                if e["errors"]:
                    raise RuntimeError(f"dsfs bench: {e['errors']} read errors")
                files, seconds = e["files"], e["seconds"]
            else:
                drop_caches()
                plan = os.path.join(self.mnt, ".dsfs", "plan") if spec["plan"] else ""
                res = subprocess.run(
                    self.counted([sys.executable, "-c", PY_READER, root, str(seed), plan,
                                  str(JOBS), str(self.args.epoch_seconds),
                                  "processes" if reader == "processes" else "threads", order]),
                    input="\n".join(self.paths), text=True, capture_output=True,
                    timeout=max(600, 20 * self.args.epoch_seconds))
                if res.returncode != 0:
                    raise RuntimeError(f"python reader failed: {res.stderr.strip()}")
                files, seconds = (float(x) for x in res.stdout.split())
            end = process_usage(pid)
            self.stop_profile(profile)
            syscalls = self.stop_counting(counting, files) if counting else None
            proxy_end = process_usage(self.proxy.proc.pid)["cpu_s"] if self.proxy else 0
            after = self.stats()
        finally:
            self.umount()
            if self.args.syscalls:
                self.remove_cgroups()
        delta = stats_delta(before, after)
        threads_cpu_s, busiest_thread = thread_cpu(start, end, seconds)
        inflight = after["prefetch"]["inflight"]
        return {"files": int(files), "seconds": seconds, "files_per_s": files / seconds,
                "cpu_us_per_file": 1e6 * (end["cpu_s"] - start["cpu_s"]) / max(files, 1),
                # The latency emulator's own CPU, which a real network would not take from the
                # readers on this machine.
                "proxy_cpu_us_per_file": 1e6 * (proxy_end - proxy_start) / max(files, 1),
                "switches_per_file": {
                    k: (end[f"{k}_switches"] - start[f"{k}_switches"]) / max(files, 1)
                    for k in ("voluntary", "involuntary")},
                "threads_cpu_s": threads_cpu_s, "busiest_thread": busiest_thread,
                "rss_bytes": end["rss_bytes"], "hwm_bytes": end["hwm_bytes"],
                "cache_bytes": cache, "reads": delta["reads"], "gets": delta["gets"],
                # Guesses: bytes fetched ahead, read by a reader, evicted before any read.
                "prefetched_bytes": delta["prefetched_bytes"], "used_bytes": delta["used_bytes"],
                "wasted_bytes": delta["wasted_bytes"],
                "stall_p99_us": delta["stall_p99_us"], "leader": delta["leader"],
                "inflight_peak": inflight.get("peak"),
                "fetches_opened_for_plan": inflight.get("fetches_opened_for_plan"),
                # FUSE requests the kernel sent per file read, by kind (stats.json)
                "fuse_requests_per_file": {
                    op: round((n - before["requests"].get(op, 0)) / max(files, 1), 3)
                    for op, n in after["requests"].items() if n > before["requests"].get(op, 0)},
                "syscalls_per_file": syscalls}

    # ---- --perf: where the CPUs went during the first run of each case ----

    def start_profile(self, name, daemon_pid):
        """`perf record` of every CPU (cpu-clock: a VM may have no PMU) while the reader runs."""
        data = os.path.join(self.workdir, f"{name}.perf.data")
        proc = subprocess.Popen([self.args.perf_binary, "record", "-a", "-e", "cpu-clock", "-F",
                                 "997", "-o", data, "--", "sleep", "600"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf opens its events on every CPU before the epoch starts
        return proc, data, name, daemon_pid

    def stop_profile(self, profile):
        """Stops the recording and writes three reports to --perf: CPU by thread (the C reader is
        a `dsfs` process too: the pid tells it from the daemon), the mount daemon's by thread
        name, library and function, and every process's by the same."""
        if profile is None:
            return
        proc, data, name, daemon_pid = profile
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        base = [self.args.perf_binary, "report", "-i", data, "--stdio", "--no-children",
                "--symfs", "/", "--kallsyms", "/proc/kallsyms"]
        with open(os.path.join(self.args.perf, f"{name}.txt"), "w") as out:
            for extra in (["--sort", "pid", "--percent-limit", "0.3"],
                          ["--pid", str(daemon_pid), "--sort", "comm,dso,sym",
                           "--percent-limit", "0.2"],
                          ["--sort", "comm,dso,sym", "--percent-limit", "0.3"]):
                out.write(f"==== perf report {' '.join(extra)} (mount daemon: {daemon_pid})\n")
                out.flush()
                subprocess.run(base + extra, stdout=out, stderr=subprocess.DEVNULL, timeout=300)
        os.unlink(data)

    # ---- --syscalls: what the kernel did per file, in the daemon and in the reader ----
    # Each side runs in a cgroup of its own (v2), counted system-wide by one `perf stat`: a
    # process's threads started later (FUSE starts workers on demand) join its cgroup, where
    # `perf stat -p` would miss them.

    # cgroup v2: the whole hierarchy (a unified mount) or, beside v1 controllers, its own mount.
    CGROUP_ROOT = next((d for d in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                        if os.path.exists(os.path.join(d, "cgroup.controllers"))), None)

    @staticmethod
    def cgroup_name(side):
        return f"dsfs-first-epoch-{os.getpid()}-{side}"

    def cgroup(self, side):
        if self.CGROUP_ROOT is None:
            sys.exit("bench: --syscalls needs a cgroup v2 hierarchy (/sys/fs/cgroup)")
        name = self.cgroup_name(side)
        os.makedirs(os.path.join(self.CGROUP_ROOT, name), exist_ok=True)
        return name

    def start_counting(self, daemon_pid):
        daemon, reader = self.cgroup("daemon"), self.cgroup("reader")
        with open(os.path.join(self.CGROUP_ROOT, daemon, "cgroup.procs"), "w") as f:
            f.write(str(daemon_pid))  # every thread of it
        out = os.path.join(self.workdir, "epoch.stat")
        proc = subprocess.Popen([self.args.perf_binary, "stat", "-a", "-x", ",", "-o", out, "-e",
                                 ",".join(COUNTED_EVENTS), "--for-each-cgroup",
                                 f"{daemon},{reader}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf opens its events on every CPU before the epoch starts
        return proc, out, {daemon: "daemon", reader: "reader"}

    def counted(self, argv):
        """The reader's command, moved into the reader's cgroup first with --syscalls (the
        Python interpreter's start-up is counted too)."""
        if not self.args.syscalls:
            return argv
        procs = os.path.join(self.CGROUP_ROOT, self.cgroup("reader"), "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "reader"] + [str(a) for a in argv]

    def stop_counting(self, counting, files):
        """{"daemon": {kind: per file}, "reader": {...}}; the cgroups are removed (the daemon's
        once it has exited)."""
        proc, out, sides = counting
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        per_file = {side: {} for side in sides.values()}
        with open(out) as f:
            for line in f:
                fields = line.strip().split(",")
                if len(fields) < 4 or not fields[0].isdigit() or fields[3] not in sides:
                    continue
                kind = fields[2].removeprefix("syscalls:sys_enter_")
                per_file[sides[fields[3]]][kind] = round(int(fields[0]) / max(files, 1), 3)
        return per_file

    def remove_cgroups(self):
        for side in ("daemon", "reader"):
            path = os.path.join(self.CGROUP_ROOT or "", self.cgroup_name(side))
            try:
                os.rmdir(path)  # empty by now: the reader exited, the daemon was unmounted
            except FileNotFoundError:
                pass
            except OSError as e:  # a daemon still exiting: the next epoch's rmdir takes it
                log(f"cgroup {path} not removed yet: {e}")

    def raw_epoch(self, url, seed):
        out = os.path.join(self.workdir, "raw.json")
        run([self.raw, "--redis", url, "--dataset", "bench", "--pattern", "epochs", "--jobs", JOBS,
             "--pipeline", 4, "--epochs", 1, "--seed", seed, "--json", out,
             "--files", self.args.raw_files], timeout=900)
        with open(out) as f:
            e = json.load(f)["epochs"][0]
        return {"files": e["files"], "seconds": e["seconds"], "files_per_s": e["files_per_s"]}

    # ---- the sweep ----

    def sweep(self):
        a = self.args
        for rtt in a.rtts:
            url = self.url_for(rtt)
            runs = {}
            raw = []
            # One epoch first, not recorded, with the largest cache: the first daemon to take more
            # memory than any before it pays for fresh pages (a VM that hands free memory back to
            # its host faults them in again), and read 1,708 files/s against 5,796-7,440 in the
            # runs after it (`first_epoch_0ms_s27`, prefetching off, the first case every run).
            warm = self.epoch(next(iter(self.builds.values())), url, a.modes[0],
                              max(a.caches) / 100, a.readers[0], a.orders[0], 999)
            log(f"rtt {rtt} ms, warm-up epoch (not recorded): {warm['files_per_s']:.0f} files/s")
            for rep in range(a.runs):
                seed = 1000 + rep
                raw.append(self.raw_epoch(url, seed)["files_per_s"])
                for fraction in a.caches:
                    # Modes take turns going first, as builds do (below).
                    for mode in a.modes[rep % len(a.modes):] + a.modes[:rep % len(a.modes)]:
                        for reader, order in ((r, o) for o in a.orders for r in a.readers):
                            # Builds alternate in order from run to run, so that what one
                            # case leaves behind for the next (memory freed, pages to reclaim)
                            # favours neither: with prefetching off, the same code in both,
                            # a pair once read 3,882 and 5,385 files/s, first and second.
                            builds = list(self.builds.items())
                            for label, build in (builds[::-1] if rep % 2 else builds):
                                # --perf: the first run of each case
                                profile = (f"{label}-rtt{rtt}-cache{fraction}-{mode}-{reader}"
                                           f"-{order}" if a.perf and rep == 0 else None)
                                fig = self.epoch(build, url, mode, fraction / 100, reader, order,
                                                 seed, profile)
                                runs.setdefault((label, fraction, mode, reader, order),
                                                []).append(fig)
                                log(f"rtt {rtt} ms, cache {fraction}%, {mode}, {reader}, {order}, "
                                    f"{label}, run {rep + 1}: {fig['files_per_s']:.0f} files/s, "
                                    f"{fig['cpu_us_per_file']:.0f} us CPU/file "
                                    f"(proxy {fig['proxy_cpu_us_per_file']:.0f}), "
                                    f"{fig['switches_per_file']['voluntary']:.1f} + "
                                    f"{fig['switches_per_file']['involuntary']:.1f} switches/file, reads "
                                    f"{fig['reads']}, peak {fig['inflight_peak']}, prefetched "
                                    f"{fig['prefetched_bytes'] / 2**20:.0f} MiB (wasted "
                                    f"{fig['wasted_bytes'] / 2**20:.0f}), busiest thread "
                                    f"{fig['busiest_thread']['name']} "
                                    f"{fig['busiest_thread']['share']:.0%} of the epoch")
            self.results["raw"].append({"rtt_ms": rtt, "runs": raw, "files_per_s": median(raw)})
            log(f"rtt {rtt} ms, raw Redis: {median(raw):.0f} files/s")
            for (label, fraction, mode, reader, order), figs in runs.items():
                self.results["cases"].append({
                    "build": label, "rtt_ms": rtt, "cache_percent": fraction, "mode": mode,
                    "reader": reader, "order": order, "runs": figs,
                    "files_per_s": median([f["files_per_s"] for f in figs]),
                    "cpu_us_per_file": median([f["cpu_us_per_file"] for f in figs]),
                    "hwm_mib": median([f["hwm_bytes"] for f in figs]) / 2**20,
                    "ready_share": median([f["reads"]["ready"] / max(1, sum(f["reads"].values()))
                                           for f in figs])})
            self.save()

    def save(self):
        save_results(self.results, self.args.results_dir, self.args.name)


# ---- report --------------------------------------------------------------------------------------

def case(results, **match):
    for c in results["cases"]:
        # Results written before --orders were all shuffled.
        if all(c.get(k, "shuffled" if k == "order" else None) == v for k, v in match.items()):
            return c
    return None


def orders_of(cfg):
    return cfg.get("orders", ["shuffled"])


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfg = results["config"]
    rtts = cfg["rtts"]
    rows = [(reader, order) for order in orders_of(cfg) for reader in cfg["readers"]]
    fig, axes = plt.subplots(len(rows), len(cfg["caches"]), sharey=True,
                             figsize=(4 * len(cfg["caches"]), 3.2 * len(rows)), squeeze=False)
    for row, (reader, order) in enumerate(rows):
        for col, fraction in enumerate(cfg["caches"]):
            ax = axes[row][col]
            for label in cfg["labels"]:
                for mode in cfg["modes"]:
                    ys = [(case(results, build=label, rtt_ms=r, cache_percent=fraction, mode=mode,
                                reader=reader, order=order) or {}).get("files_per_s", 0)
                          for r in rtts]
                    ax.plot(range(len(rtts)), ys, marker="o",
                            linestyle="-" if label == cfg["labels"][0] else "--",
                            label=f"{mode} ({label})" if len(cfg["labels"]) > 1 else mode)
            raw = [next((x["files_per_s"] for x in results["raw"] if x["rtt_ms"] == r), 0)
                   for r in rtts]
            ax.plot(range(len(rtts)), raw, color="gray", linestyle=":", label="raw Redis")
            ax.set_xticks(range(len(rtts)), [f"{r} ms" for r in rtts])
            ax.set_title(f"{reader} reader, {order}, cache {fraction}%", fontsize=9)
            ax.set_yscale("log")
            if col == 0:
                ax.set_ylabel("first epoch, files/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(results, name):
    cfg = results["config"]
    ds = results["dataset"]
    lines = [DOCS_START, "",
             f"Generated by `bench/first_epoch.py` on {results['machine']['date']} "
             f"({results['machine']['cpus']} CPUs, {results['machine']['cpu_model']}): "
             f"{ds['files']:,} files, {ds['bytes'] / 1e6:.0f} MB, a fresh mount per epoch, page "
             f"cache dropped, median of {cfg['runs']}; raw = `dsfs_bench_redis_raw` (8 threads x "
             f"4 pipelined GETs, no FUSE). Files/s (daemon CPU µs per file; reads found ready). "
             f"Results: `bench/results/{name}.json`, plot `bench/results/{name}.png`.", ""]
    for label, src in results["builds"].items():
        lines.append(f"- `{label}`: {src.get('commit', '?')}"
                     f"{' + uncommitted changes' if src.get('uncommitted_changes') else ''}")
    lines.append("")
    orders = orders_of(cfg)
    header = "| RTT | cache | reader | " + ("order | " if orders != ["shuffled"] else "") + \
        "raw Redis | " + " | ".join(
        f"{m} ({label})" if len(cfg["labels"]) > 1 else m
        for m in cfg["modes"] for label in cfg["labels"]) + " |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for rtt in cfg["rtts"]:
        raw = next((x["files_per_s"] for x in results["raw"] if x["rtt_ms"] == rtt), 0)
        for fraction in cfg["caches"]:
            for reader, order in ((r, o) for o in orders for r in cfg["readers"]):
                cells = []
                for mode in cfg["modes"]:
                    for label in cfg["labels"]:
                        c = case(results, build=label, rtt_ms=rtt, cache_percent=fraction,
                                 mode=mode, reader=reader, order=order)
                        cells.append("" if c is None else
                                     f"{c['files_per_s']:,.0f} ({c['cpu_us_per_file']:.0f} µs; "
                                     f"{100 * c['ready_share']:.0f}%)")
                lines.append(f"| {rtt} ms | {fraction}% | {reader} | "
                             + (f"{order} | " if orders != ["shuffled"] else "")
                             + f"{raw:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", f"![first epoch](../bench/results/{name}.png)", "", DOCS_END]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1,000 files, RTT 0 and 10 ms, cache 100%%, one run")
    p.add_argument("--builds", default="build",
                   help="build directories, comma-separated, compared side by side (build)")
    p.add_argument("--labels", default=None,
                   help="a name per build for the tables (default: the directories' names)")
    p.add_argument("--files", type=int, default=None, help="dataset size (3,000; --quick 1,000)")
    p.add_argument("--runs", type=int, default=None, help="runs per case, median (3; --quick 1)")
    p.add_argument("--rtts", default=None, help="RTTs in ms (0,10,100; --quick 0,10)")
    p.add_argument("--caches", default=None,
                   help="cache sizes, percent of the data (25,100,200; --quick 100)")
    p.add_argument("--modes", default=",".join(MODES), help="off,auto,plan")
    p.add_argument("--readers", default=",".join(DEFAULT_READERS),
                   help="c,python (and processes: the Python reader in forked processes)")
    p.add_argument("--orders", default="shuffled",
                   help="the epoch's order: shuffled (a new permutation, as a shuffling "
                        "sampler), sequential (the files sorted, as a loader without shuffling "
                        "or `tar` reads them), random (draws with replacement; Python readers "
                        "only), comma-separated (default: shuffled)")
    p.add_argument("--epoch-seconds", type=int, default=20,
                   help="cut an epoch after this long (20)")
    p.add_argument("--data-dir", default="/dev/shm/dsfs-bench-data")
    p.add_argument("--keep-data", action="store_true")
    p.add_argument("--name", default="first_epoch")
    p.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--perf", default=None, metavar="DIR",
                   help="profile every CPU (perf record) during each case's first run; reports "
                        "by thread and by function to DIR/CASE.txt")
    p.add_argument("--perf-binary", default="perf")
    p.add_argument("--syscalls", action="store_true",
                   help="count the daemon's and the reader's syscalls by kind, context switches "
                        "and page faults per file (perf stat) in every run")
    p.add_argument("--raw-files", type=int, default=0,
                   help="raw Redis reads only the first N files (0: all; at 100 ms it reads "
                        "about 315 files/s, a 40,000-file epoch two minutes)")
    args = p.parse_args()
    require_root()
    q = args.quick
    args.files = args.files or (1000 if q else 3000)
    args.runs = args.runs or (1 if q else 3)
    args.rtts = [int(x) for x in (args.rtts or ("0,10" if q else "0,10,100")).split(",")]
    args.caches = [int(x) for x in (args.caches or ("100" if q else "25,100,200")).split(",")]
    args.modes = args.modes.split(",")
    args.readers = args.readers.split(",")
    check_choices(args.modes, MODES, "mode")
    args.orders = args.orders.split(",")
    check_choices(args.readers, READERS, "reader")
    check_choices(args.orders, ORDERS, "order")
    if "random" in args.orders and "c" in args.readers:
        p.error("--orders random is for the Python readers: `dsfs bench` has no order with "
                "replacement; pass --readers python (or processes)")
    args.builds, args.labels = split_builds(args.builds, args.labels,
                                            "bench: --labels needs one distinct name per build")
    interrupt_on_signals()
    if args.perf:
        os.makedirs(args.perf, exist_ok=True)
    bench = Bench(args)
    run_bench(bench)
    png = publish_results(bench, plot, markdown, (DOCS_START, DOCS_END, DOCS_HEADING))
    log(f"results: {args.results_dir}/{args.name}.json, {png}")


if __name__ == "__main__":
    main()
