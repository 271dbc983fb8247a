"""Helpers the benchmark scripts share: the builds they run, running commands, a private
redis-server, `dsfs proxy`, the synthetic dataset in tmpfs, a run's set-up and clean-up, the mount
daemon's /proc figures, the results files and the generated sections of docs/benchmarks.md."""
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args, env=None, check=True, capture=True, timeout=3600):
    res = subprocess.run([str(a) for a in args], env=env, timeout=timeout, text=True,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        raise RuntimeError(f"command failed ({res.returncode}): {' '.join(map(str, args))}\n"
                           f"{res.stdout or ''}\n{res.stderr or ''}")
    return res


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def median(values):
    return statistics.median(values) if values else 0.0


def machine_info():
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem_kb / 2**20, 1),
            "kernel": platform.release(), "date": datetime.date.today().isoformat(),
            "proxy_threads": proxy_threads(), "redis_io_threads": redis_io_threads()}


def proxy_threads():
    """Threads of the `dsfs proxy` the scripts start: 1 unless DSFS_BENCH_PROXY_THREADS says."""
    return int(os.environ.get("DSFS_BENCH_PROXY_THREADS", 1))


def redis_io_threads():
    """`io-threads` of RedisServer (cluster.py refuses more than 1): 1, Redis's default
    (one thread reads requests and writes replies), unless DSFS_BENCH_REDIS_IO_THREADS says. More
    threads write the replies of many clients in parallel, for a server with CPUs to spare."""
    return int(os.environ.get("DSFS_BENCH_REDIS_IO_THREADS", 1))


def redis_io_threads_args():
    threads = redis_io_threads()
    return ["--io-threads", str(threads)] if threads > 1 else []


def disk_tier_bytes(dataset, fraction=1.0):
    """`--disk-cache-size` for `dataset` (tree_info): what holds it whole (its bytes + 1% and a
    4 KiB block per file, docs/cli.md) times `fraction` (below 1 the tier evicts as it is
    written), plus 16 MiB."""
    whole = dataset["bytes"] * 1.01 + 4096 * dataset["files"]
    return int(fraction * whole) + (16 << 20)


def load_average():
    """The 1-minute load average (other work on a shared machine skews figures)."""
    return os.getloadavg()[0]


def fs_type(path):
    res = run(["stat", "-f", "-c", "%T", path], check=False)
    return res.stdout.strip()


def private_env(workdir):
    """The environment for dsfs commands of a benchmark: its own DSFS_HOME under `workdir`, and no
    DSFS_REDIS from the caller (every command names the Redis it uses)."""
    env = dict(os.environ, DSFS_HOME=os.path.join(workdir, "home"))
    env.pop("DSFS_REDIS", None)
    return env


def build_binary(build, name="dsfs"):
    """The absolute path of the executable `name` (dsfs, bench/dsfs_bench_redis_raw) in the build
    directory `build`; exits with "bench: PATH is missing; build first (scripts/build BUILD)" where
    there is none."""
    path = os.path.abspath(os.path.join(build, name))
    if not os.access(path, os.X_OK):
        sys.exit(f"bench: {path} is missing; build first (scripts/build {build})")
    return path


def build_source(build):
    """Which sources the build was made from: its CMake source directory and, from git there
    (or a .commit file beside an exported snapshot), the commit and whether the C++ differed."""
    info = {"build": os.path.abspath(build)}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    info["source"] = line.split("=", 1)[1].strip()
                elif line.startswith("CMAKE_BUILD_TYPE:"):
                    info["build_type"] = line.split("=", 1)[1].strip()
    except OSError:
        return info
    source = info.get("source")
    if source and os.path.exists(os.path.join(source, ".commit")):
        with open(os.path.join(source, ".commit")) as f:
            info.update(commit=f.read().strip(), uncommitted_changes=False)
    elif source:
        head = run(["git", "-C", source, "rev-parse", "--short", "HEAD"], check=False)
        dirty = run(["git", "-C", source, "status", "--porcelain", "--", "src", "fs", "prefetch",
                     "tools", "cuda"], check=False)
        if head.returncode == 0:
            info.update(commit=head.stdout.strip(), uncommitted_changes=bool(dirty.stdout.strip()))
    return info


def split_builds(builds, labels, error):
    """--builds (build directories, comma-separated) and --labels (a name per build, by default
    each directory's name) as two lists; exits with `error` unless each build has its own label."""
    builds = builds.split(",")
    labels = (labels.split(",") if labels
              else [os.path.basename(os.path.abspath(b)) for b in builds])
    if len(labels) != len(builds) or len(set(labels)) != len(labels):
        sys.exit(error)
    return builds, labels


def find_builds(builds, labels):
    """{label: {"dsfs": its dsfs binary (build_binary), "source": build_source}} of the builds a
    benchmark compares (split_builds' lists), in their order; exits where one has no dsfs."""
    return {label: {"dsfs": build_binary(build), "source": build_source(build)}
            for label, build in zip(labels, builds)}


def make_workdir(prefix):
    """A benchmark's temporary directory (tempfile.mkdtemp with `prefix`), the private_env of it
    and its empty mount point WORKDIR/mnt: (workdir, env, mnt)."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt)
    return workdir, private_env(workdir), mnt


def unmount(dsfs, mnt, env, *options):
    """`dsfs umount MNT [OPTIONS]` where `mnt` is mounted, and a lazy `umount -l` (logged) where
    that left it mounted."""
    if os.path.ismount(mnt):
        res = run([dsfs, "umount", mnt, *options], env=env, check=False)
        if os.path.ismount(mnt):
            log(f"dsfs umount failed ({res.stderr.strip()}); lazy unmount")
            run(["umount", "-l", mnt], check=False)


def check_choices(values, choices, what):
    """Exits with "bench: unknown WHAT 'VALUE'; choose from A, B, ..." at the first of `values`
    (a command-line list) that is not one of `choices`."""
    for value in values:
        if value not in choices:
            sys.exit(f"bench: unknown {what} {value!r}; choose from {', '.join(choices)}")


def require_root():
    """Exits unless run as root, which mounting and dropping the page cache need."""
    if os.geteuid() != 0:
        sys.exit("bench: needs root (FUSE mounts, drop_caches)")


def remove_created_data(created_data, data_dir):
    """Removes the dataset a run synthesized (`created_data`; None: it made none, or --keep-data
    keeps it), then `data_dir` itself when nothing else is left in it."""
    if created_data:
        shutil.rmtree(created_data, ignore_errors=True)
        try:
            os.rmdir(data_dir)
        except OSError:
            pass


def close_bench(bench):
    """The clean-up of a benchmark with a RedisServer (bench.redis) and a Proxy (bench.proxy):
    unmounts (bench.umount()), stops those of them that were started and removes bench.workdir
    and the dataset this run created (remove_created_data)."""
    bench.umount()
    if bench.proxy:
        bench.proxy.close()
    if bench.redis:
        bench.redis.close()
    shutil.rmtree(bench.workdir, ignore_errors=True)
    remove_created_data(bench.created_data, bench.args.data_dir)


def save_results(results, results_dir, name):
    """Writes `results` to RESULTS_DIR/NAME.json (indented), making the directory if needed."""
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)


def interrupt_on_signals():
    """Makes Ctrl-C and SIGTERM both raise KeyboardInterrupt, so that a run cleans up (a shell's
    background job starts with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def run_bench(bench):
    """bench.start() and bench.sweep(), then bench.close() whatever happened, and the load average
    at the end in bench.results; returns the seconds the run took."""
    t0 = time.time()
    try:
        bench.start()
        bench.sweep()
    finally:
        bench.close()
    bench.results["load_average"]["end"] = load_average()
    return time.time() - t0


def show_docs_section(text, docs, update):
    """Prints a generated section of docs/benchmarks.md and, with `update`, writes it there
    (update_docs_section; `docs`: its start marker, end marker and heading)."""
    print(text)
    if update:
        update_docs_section(*docs, text)


def publish_results(bench, plot, markdown, docs):
    """The end of a run: NAME.json (bench.save()), plot(results, NAME.png) and the docs section
    markdown(results, NAME), printed and, unless --quick or --no-docs, written to
    docs/benchmarks.md (show_docs_section). Returns NAME.png's path."""
    a = bench.args
    bench.save()
    png = os.path.join(a.results_dir, f"{a.name}.png")
    plot(bench.results, png)
    show_docs_section(markdown(bench.results, a.name), docs, not a.quick and not a.no_docs)
    return png


def wait_for_socket(path, proc, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {path}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {path} within {timeout} s")


class RedisServer:
    """A private redis-server on a unix socket (no persistence), stopped by close()."""

    def __init__(self, workdir):
        self.sock = os.path.join(workdir, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", workdir,
             "--logfile", os.path.join(workdir, "redis.log"), *redis_io_threads_args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_socket(self.sock, self.proc, "redis-server")

    @property
    def url(self):
        return f"unix://{self.sock}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Proxy:
    """`dsfs proxy` from a unix socket to Redis's, adding `rtt_ms`."""

    def __init__(self, dsfs, workdir, upstream_sock, rtt_ms, threads=None):
        self.sock = os.path.join(workdir, f"proxy-{rtt_ms}.sock")
        # Real-time priority keeps releases on time on a busy machine; at 0-1 ms it would
        # only cost throughput (bench/proxy_accuracy.py).
        realtime = ["--realtime"] if rtt_ms >= 10 and os.geteuid() == 0 else []
        # One thread: on 16 CPUs it carried 13,417 files/s at 100 ms with 2,048 GETs outstanding
        # at 51 us of CPU each (0.7 of a CPU), four threads 10,968 and varied more
        # (docs/benchmarks.md, "what one Redis serves with many GETs outstanding").
        # DSFS_BENCH_PROXY_THREADS sets another count.
        if threads is None:
            threads = proxy_threads()
        more = ["--threads", str(threads)] if threads > 1 else []
        with open(os.path.join(workdir, "proxy.log"), "a") as log_file:
            self.proc = subprocess.Popen(
                [dsfs, "proxy", "--listen", f"unix:{self.sock}", "--upstream",
                 f"unix:{upstream_sock}", "--rtt", f"{rtt_ms}ms", *realtime, *more],
                stdout=subprocess.DEVNULL, stderr=log_file)
        wait_for_socket(self.sock, self.proc, "dsfs proxy")

    @property
    def url(self):
        return f"unix://{self.sock}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


def synth_dataset(dsfs, data_dir, files):
    """An ImageNet-like synthetic dataset of about `files` JPEGs under `data_dir` (tmpfs), reused
    when a complete one with these settings exists. Returns (root of the data, whether this call
    created it)."""
    classes = max(1, files // 200) if files >= 200 else 1
    per_class = max(1, files // classes)
    root = os.path.join(data_dir, f"synth-{classes}x{per_class}")
    marker = os.path.join(root, ".complete")
    created = False
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        log(f"synthesizing {classes} classes x {per_class} images into {root} (tmpfs)")
        try:
            run([dsfs, "synth", os.path.join(root, "data"), "--classes", classes,
                 "--per-class", per_class, "--seed", "1"], capture=False)
        except BaseException:  # Ctrl-C included: leave no half-written dataset in memory
            shutil.rmtree(root, ignore_errors=True)
            raise
        open(marker, "w").close()
        created = True
    return os.path.join(root, "data"), created


def tree_info(data):
    """{"path", "files", "bytes", "mean_file_bytes", "filesystem"} of a directory tree."""
    files = sizes = 0
    for dirpath, _, names in os.walk(data):
        for n in names:
            files += 1
            sizes += os.path.getsize(os.path.join(dirpath, n))
    return {"path": data, "files": files, "bytes": sizes,
            "mean_file_bytes": sizes // max(files, 1), "filesystem": fs_type(data)}


def prepare_dataset(bench):
    """The dataset of a benchmark (synth_dataset with bench.dsfs, bench.args.data_dir and .files):
    sets bench.created_data to the directory to remove at the end (one this call synthesized,
    unless --keep-data), bench.dataset and bench.results["dataset"] to its tree_info; returns the
    root of its data."""
    data, created = synth_dataset(bench.dsfs, bench.args.data_dir, bench.args.files)
    if created and not bench.args.keep_data:
        bench.created_data = os.path.dirname(data)
    bench.dataset = tree_info(data)
    bench.results["dataset"] = bench.dataset
    return data


def relative_paths(data):
    """The files of a directory tree, as paths relative to it, sorted."""
    return sorted(os.path.relpath(os.path.join(d, n), data)
                  for d, _, names in os.walk(data) for n in names)


def ingest(dsfs, data, url, env):
    """`dsfs ingest DATA --dataset bench --redis URL --progress none`: the dataset the benchmarks
    mount."""
    run([dsfs, "ingest", data, "--dataset", "bench", "--redis", url, "--progress", "none"],
        env=env)


def serve_dataset(bench, data):
    """Starts bench.redis (a RedisServer in bench.workdir), ingests `data` into it, then removes
    bench.created_data: Redis holds the data now, which frees the tmpfs copy's memory."""
    bench.redis = RedisServer(bench.workdir)
    log(f"ingesting {data} into {bench.redis.url}")
    ingest(bench.dsfs, data, bench.redis.url, bench.env)
    if bench.created_data:
        shutil.rmtree(bench.created_data, ignore_errors=True)


def mount_daemon_pid(mountpoint):
    """The pid of the `dsfs mount MOUNTPOINT` daemon serving it, or None."""
    mountpoint = os.path.abspath(mountpoint)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if "mount" in argv and mountpoint in argv[argv.index("mount") + 1:]:
            return int(entry)
    return None


def process_usage(pid):
    """{"rss_bytes", "hwm_bytes", "cpu_s", "minor_faults"} of a live process: VmRSS and VmHWM
    from /proc/PID/status, user + system CPU seconds and minor page faults from /proc/PID/stat."""
    usage = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                usage["rss_bytes" if key == "VmRSS" else "hwm_bytes"] = int(value.split()[0]) * 1024
    with open(f"/proc/{pid}/stat") as f:
        # Fields after the command name (which may hold spaces) start at state, field 3.
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    usage["cpu_s"] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    usage["minor_faults"] = int(fields[7])  # minflt: pages the process touched for the first time
    # Context switches of its live threads (voluntary: it slept; nonvoluntary: preempted), and
    # each live thread's name and CPU seconds (dsfs names its own threads: fetch-N,
    # disk-write-N...; FUSE's workers keep the daemon's name), to find one that saturates.
    usage["voluntary_switches"] = usage["involuntary_switches"] = 0
    usage["threads"] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "voluntary_ctxt_switches":
                        usage["voluntary_switches"] += int(value)
                    elif key == "nonvoluntary_ctxt_switches":
                        usage["involuntary_switches"] += int(value)
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                text = f.read()
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            usage["threads"][int(task)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            pass
    return usage


def thread_cpu_used(start_threads, end_threads):
    """[(CPU seconds, name)] of each thread between two process_usage()["threads"] samples,
    busiest first (a thread that ended between them is not counted; one that began counts from
    zero)."""
    return sorted(((cpu - start_threads.get(tid, (name, 0.0))[1], name)
                   for tid, (name, cpu) in end_threads.items()), reverse=True)


def thread_cpu(start, end, seconds):
    """CPU seconds per thread name between two process_usage() samples, and the busiest single
    thread: its name and its CPU as a share of `seconds` (near 1.0: that one thread bounds the
    throughput)."""
    used = thread_cpu_used(start["threads"], end["threads"])
    by_name = {}
    for cpu, name in used:
        by_name[name] = by_name.get(name, 0.0) + cpu
    busiest_cpu, busiest_name = used[0] if used else (0.0, "")
    return ({k: round(v, 3) for k, v in sorted(by_name.items())},
            {"name": busiest_name, "share": busiest_cpu / seconds if seconds > 0 else 0.0})


def update_docs_section(start_marker, end_marker, heading, text):
    """Replaces the text between the markers in docs/benchmarks.md (`text` includes them), or
    appends `heading` and `text` when the markers are not there yet."""
    path = os.path.join(REPO, "docs", "benchmarks.md")
    with open(path) as f:
        doc = f.read()
    if start_marker in doc and end_marker in doc:
        head = doc[:doc.index(start_marker)]
        tail = doc[doc.index(end_marker) + len(end_marker):]
        doc = head + text + tail
    else:
        doc = doc.rstrip("\n") + f"\n\n{heading}\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(doc)
