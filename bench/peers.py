#!/usr/bin/python3
"""dsfs beside the alternatives (issue 15): the same shuffled-epoch benchmark against what a user
would pick instead of dsfs, every network peer behind the same `dsfs proxy --rtt`.

    bench/peers.sh [--build build] [--files 2000] [--rtts 0,10,100] [--runs 3]
                   [--cache-percent 125] [--epoch-seconds 90] [--quick] [--no-docs]

(`bench/peers.sh` installs the Debian packages rclone, nginx and python3-redis when missing, then
runs this script.) Synthesizes an ImageNet-like dataset (`dsfs synth`) into tmpfs (its own
--data-dir, kept for the whole run: nginx and the tmpfs peer read it), ingests it into a private
redis-server on a loopback TCP port (`dsfs ingest`), stores the same files under plain keys
`peers:<relative path>` in the same server for the redis-py loader, and starts a private nginx
(its own config in a temp dir, a free loopback port, `autoindex on`) serving the dataset's tree.
For every RTT, two `dsfs proxy --listen 127.0.0.1:0 --rtt R` (R = 0 too: every network peer pays
the proxy's hop) stand in front of Redis and of nginx. Peers:

  tmpfs     the reader on the tmpfs copy itself: the bound (no network; once per run)
  dsfs      `dsfs mount --redis redis://PROXY --dataset bench --cache-size C` (defaults
            otherwise: --prefetch auto, no plan), a fresh mount per case
  rclone    `rclone mount :http: --http-url http://PROXY/ --read-only --vfs-cache-mode full
            --vfs-cache-max-size C --cache-dir TMP --dir-cache-time 1h` (defaults otherwise),
            config from a temp RCLONE_CONFIG, a fresh mount and cache directory per case
  redis-py  8 threads sharing one `redis.Redis` (its connection pool), one GET
            `peers:<relative path>` per sample, through the Redis proxy

C = --cache-percent of the dataset's bytes, the same budget for dsfs (memory) and rclone (its
VFS cache, on disk under /tmp). The reader is one fresh Python interpreter per case running
--epochs epochs (default 2: epoch 1 cold, epoch 2 steady), 8 threads, each epoch in a new shuffled
order (seed + epoch; the same orders for every peer), the page cache dropped before every epoch
(not timed); a file system read is `open(p, "rb").read()` (open, fstat, read to EOF, close). Before
the first epoch the mount's tree is walked once (not timed, reported as the listing time): dsfs
loads its catalogue at mount, rclone lists each directory (an index page plus a HEAD per file)
and keeps it for --dir-cache-time. An epoch longer than --epoch-seconds is cut there (marked *;
its files/s is still a rate, but a cut epoch 1 leaves a cache peer's epoch 2 partly cold).

Per epoch: files, bytes (checked against the dataset), seconds, the reader's CPU; per case the
FUSE daemon's CPU (dsfs mount or rclone); per epoch the bytes and connections that went through
the proxy (its --stats-file, read 1.1 s after each epoch). Writes bench/results/NAME.json and
NAME.png and (unless --quick or --no-docs) the generated section of docs/benchmarks.md. Needs
root (mounts, drop_caches). Everything it starts (redis-server, nginx, proxies, mounts) is stopped
and removed on exit, Ctrl-C and errors included.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (REPO, build_binary, build_source, check_choices, ingest,  # noqa: E402
                    interrupt_on_signals, load_average, log, machine_info, make_workdir, median,
                    mount_daemon_pid, prepare_dataset, process_usage, publish_results,
                    relative_paths, remove_created_data, require_root, run, run_bench,
                    save_results, show_docs_section)
from cluster import TcpProxy, TcpRedis, free_port, stop_process, wait_port  # noqa: E402

DOCS_START = "<!-- peers.py: start -->"
DOCS_END = "<!-- peers.py: end -->"
DOCS_HEADING = "## Beside the alternatives (issue 15, `bench/peers.sh`)"
JOBS = 8
PEERS = ("tmpfs", "dsfs", "rclone", "redis-py")
NETWORK_PEERS = ("dsfs", "rclone", "redis-py")
PEER_LABELS = {"tmpfs": "tmpfs (bound)", "dsfs": "dsfs mount", "rclone": "rclone mount (HTTP)",
               "redis-py": "redis-py GETs"}
KEY_PREFIX = "peers:"
NGINX = "/usr/sbin/nginx"

# A fresh interpreter per case. argv: mode (fs | redis), target (a root directory | HOST:PORT),
# seed, threads, epochs, seconds after which an epoch is cut, the proxy's stats file or "".
# stdin: the relative paths. Prints JSON: one object per epoch.
PEERS_READER = r"""
import json, os, random, sys, threading, time
mode, target, seed, threads, epochs = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                       int(sys.argv[4]), int(sys.argv[5]))
limit, proxy_stats = float(sys.argv[6]), sys.argv[7]
paths = sorted(l for l in sys.stdin.read().split("\n") if l)
if mode == "redis":
    import redis
    host, port = target.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=300)
    prefix = b"peers:"
def proxy_counters():
    if not proxy_stats:
        return None
    time.sleep(1.1)  # the proxy rewrites the file every second
    with open(proxy_stats) as f:
        s = json.load(f)
    return {"bytes_to_client": s["bytes_to_client"], "bytes_to_upstream": s["bytes_to_upstream"],
            "connections": s["connections_accepted"]}
out = []
for epoch in range(epochs):
    files = list(paths)
    random.Random(seed + epoch).shuffle(files)
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    before = proxy_counters()
    errors, done, nbytes = [], [0] * threads, [0] * threads
    def reader(i):
        try:
            for p in files[i::threads]:
                if time.perf_counter() - start > limit:
                    return
                if mode == "fs":
                    with open(os.path.join(target, p), "rb") as f:  # open, fstat, read, close
                        data = f.read()
                else:
                    data = client.get(prefix + p.encode())
                    if data is None:
                        raise OSError(f"no key for {p}")
                nbytes[i] += len(data)
                done[i] += 1
        except Exception as e:
            errors.append(e)
    workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
    cpu0 = time.process_time()
    start = time.perf_counter()
    for t in workers: t.start()
    for t in workers: t.join()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if errors: sys.exit(f"read failed: {errors[0]!r}")
    after = proxy_counters()
    out.append({"files": sum(done), "bytes": sum(nbytes), "seconds": elapsed,
                "complete": sum(done) == len(files), "reader_cpu_s": cpu,
                "proxy": None if before is None else {k: after[k] - before[k] for k in before}})
print(json.dumps(out))
"""


class Nginx:
    """A private nginx: its own config, pid file, logs and temp paths in `dir`, serving `root`
    (autoindex: the listing rclone's http backend reads) on a free loopback port, in the
    foreground as our child (`daemon off`), no system service touched."""

    def __init__(self, workdir, root):
        self.dir = os.path.join(workdir, "nginx")
        os.makedirs(self.dir)
        self.port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        d = self.dir
        with open(conf, "w") as f:
            f.write(f"""user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{self.port};
    root {root};
    autoindex on;
  }}
}}
""")
        self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", d, "-e", f"{d}/error.log",
                                      "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, "nginx")

    def close(self):
        stop_process(self.proc, signal.SIGTERM)  # fast shutdown, the workers exit with the master


class Bench:
    def __init__(self, args):
        self.args = args
        built = build_binary(args.build)
        for tool in ("rclone", NGINX, "redis-server", "fusermount3"):
            if not shutil.which(tool):
                sys.exit(f"bench: {tool} is missing; run bench/peers.sh (it installs the peers)")
        self.workdir, self.env, self.mnt = make_workdir("dsfs-peers-")
        # A copy, so that a rebuild of the build directory during the run changes nothing.
        self.dsfs = os.path.join(self.workdir, "dsfs")
        shutil.copy2(built, self.dsfs)
        self.redis = self.nginx = self.created_data = self.rclone = self.dsfs_pid = None
        self.proxies = {}
        self.results = {"machine": machine_info(), "config": vars(args).copy(),
                        "source": build_source(args.build), "versions": versions(),
                        "load_average": {"start": load_average()}, "cases": []}

    # ---- setup and teardown ----

    def start(self):
        a = self.args
        data = prepare_dataset(self)
        self.data = data
        self.paths = relative_paths(data)
        self.cache_bytes = max(1 << 20, int(self.dataset["bytes"] * a.cache_percent / 100))
        self.results["cache_bytes"] = self.cache_bytes
        self.redis = TcpRedis(self.workdir)
        url = f"redis://127.0.0.1:{self.redis.port}"
        log(f"ingesting {data} into {url} (dsfs ingest, and plain keys {KEY_PREFIX}PATH)")
        ingest(self.dsfs, data, url, self.env)
        self.store_plain_keys()
        self.nginx = Nginx(self.workdir, data)
        log(f"nginx on 127.0.0.1:{self.nginx.port} serving {data}")

    def store_plain_keys(self):
        import redis
        client = redis.Redis(host="127.0.0.1", port=self.redis.port)
        pipe = client.pipeline(transaction=False)
        for i, p in enumerate(self.paths):
            with open(os.path.join(self.data, p), "rb") as f:
                pipe.set(KEY_PREFIX + p, f.read())
            if i % 200 == 199:
                pipe.execute()
        pipe.execute()
        client.close()

    def close(self):
        """Stops everything this run started; each step runs even when an earlier one fails."""
        steps = [self.umount, self.stop_proxies] + [s.close for s in (self.nginx, self.redis) if s]
        for step in steps:
            try:
                step()
            except BaseException as e:  # keep cleaning up, Ctrl-C included
                log(f"clean-up step {step.__qualname__} failed: {e!r}")
        if os.path.ismount(self.mnt):
            log(f"{self.mnt} is still mounted; leaving {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        remove_created_data(self.created_data, self.args.data_dir)

    def stop_proxies(self):
        proxies, self.proxies = self.proxies, {}
        for p in proxies.values():
            try:
                p.close()
            except Exception as e:
                log(f"stopping a proxy failed: {e!r}; killing it")
                p.proc.kill()

    def umount(self):
        """Unmounts whichever peer is mounted, and stops rclone."""
        if os.path.ismount(self.mnt):
            if self.rclone is not None:
                res = run(["fusermount3", "-u", self.mnt], check=False)
            else:
                res = run([self.dsfs, "umount", self.mnt], env=self.env, check=False)
            if os.path.ismount(self.mnt):
                log(f"unmount failed ({res.stderr.strip()}); lazy unmount")
                run(["umount", "-l", self.mnt], check=False)
        if self.dsfs_pid is not None:
            pid, self.dsfs_pid = self.dsfs_pid, None
            stop_pid(pid)
        if self.rclone is not None:
            proc, cache_dir = self.rclone
            stop_process(proc, signal.SIGTERM)
            if os.path.ismount(self.mnt):
                run(["umount", "-l", self.mnt], check=False)
            shutil.rmtree(cache_dir, ignore_errors=True)
            self.rclone = None

    # ---- mounts ----

    def mount_dsfs(self, proxy):
        run([self.dsfs, "mount", self.mnt, "--redis", f"redis://127.0.0.1:{proxy.port}",
             "--dataset", "bench", "--cache-size", self.cache_bytes, "--timeout", "300s"],
            env=self.env, timeout=300)
        self.dsfs_pid = mount_daemon_pid(self.mnt)
        return os.path.join(self.mnt, "bench"), self.dsfs_pid

    def mount_rclone(self, proxy):
        cache_dir = tempfile.mkdtemp(prefix="rclone-cache-", dir=self.workdir)
        env = dict(os.environ, RCLONE_CONFIG=os.path.join(self.workdir, "rclone.conf"))
        log_file = os.path.join(self.workdir, "rclone.log")
        proc = subprocess.Popen(
            ["rclone", "mount", ":http:", self.mnt, "--http-url",
             f"http://127.0.0.1:{proxy.port}/", "--read-only", "--vfs-cache-mode", "full",
             "--vfs-cache-max-size", str(self.cache_bytes), "--cache-dir", cache_dir,
             "--dir-cache-time", "1h", "--log-file", log_file, "--log-level", "NOTICE"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.rclone = (proc, cache_dir)
        deadline = time.time() + 60
        while not os.path.ismount(self.mnt):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"rclone mount did not come up (see {log_file})")
            time.sleep(0.05)
        return self.mnt, proc.pid

    # ---- one case ----

    def case(self, peer, rtt, seed):
        a = self.args
        proxy = None
        daemon = None
        listing_s = listing_proxy = log_errors = None
        cache_dir_bytes = None
        if peer == "tmpfs":
            mode, target = "fs", self.data
        elif peer == "redis-py":
            proxy = self.proxies["redis"]
            mode, target = "redis", f"127.0.0.1:{proxy.port}"
        else:
            proxy = self.proxies["redis" if peer == "dsfs" else "http"]
            mode = "fs"
        try:
            if peer in ("dsfs", "rclone"):
                t0 = time.perf_counter()
                before_mount = proxy_counters(proxy)
                target, daemon = (self.mount_dsfs if peer == "dsfs" else self.mount_rclone)(proxy)
                # Not timed: the tree, listed once (rclone: an index page per folder and a HEAD
                # per file; dsfs: its catalogue, loaded at mount).
                listed = sum(len(names) for _, _, names in os.walk(target))
                listing_s = time.perf_counter() - t0
                after_listing = proxy_counters(proxy)
                listing_proxy = {k: after_listing[k] - before_mount[k] for k in after_listing}
                if listed != len(self.paths):
                    raise RuntimeError(f"{peer}: listed {listed} files, not {len(self.paths)}")
                cpu0 = process_usage(daemon)["cpu_s"]
            res = subprocess.run(
                ["/usr/bin/python3", "-c", PEERS_READER, mode, target, str(seed), str(JOBS),
                 str(a.epochs), str(a.epoch_seconds), proxy.stats_file if proxy else ""],
                input="\n".join(self.paths), text=True, capture_output=True,
                timeout=a.epochs * (a.epoch_seconds + 300))
            if res.returncode != 0:
                raise RuntimeError(f"{peer} reader failed: {res.stderr.strip()}")
            epochs = json.loads(res.stdout)
            daemon_cpu = None
            if daemon:
                usage = process_usage(daemon)
                daemon_cpu = usage["cpu_s"] - cpu0
                daemon_hwm = usage.get("hwm_bytes")
            if peer == "rclone":
                du = run(["du", "-sb", self.rclone[1]], check=False).stdout.split()
                cache_dir_bytes = int(du[0]) if du else None
                with open(os.path.join(self.workdir, "rclone.log")) as f:
                    log_errors = [l.strip() for l in f if "ERROR" in l]
                if log_errors:
                    log(f"rclone logged {len(log_errors)} errors, first: {log_errors[0]}")
        finally:
            self.umount()
        for e in epochs:
            e["files_per_s"] = e["files"] / e["seconds"]
            e["reader_cpu_us_per_file"] = 1e6 * e["reader_cpu_s"] / max(e["files"], 1)
            if e["complete"] and e["bytes"] != self.dataset["bytes"]:
                raise RuntimeError(f"{peer}: read {e['bytes']} bytes, not "
                                   f"{self.dataset['bytes']}")
        files = sum(e["files"] for e in epochs)
        return {"peer": peer, "rtt_ms": rtt, "epochs": epochs, "listing_s": listing_s,
                "listing_proxy": listing_proxy,
                "daemon_cpu_us_per_file": (None if daemon_cpu is None
                                           else 1e6 * daemon_cpu / max(files, 1)),
                "daemon_hwm_bytes": daemon_hwm if daemon else None,
                "rclone_cache_dir_bytes": cache_dir_bytes, "rclone_log_errors": log_errors}

    # ---- the sweep ----

    def sweep(self):
        a = self.args
        for run_no in range(a.runs):
            seed = 1000 + 10 * run_no
            if "tmpfs" in a.peers:
                self.record(self.case("tmpfs", None, seed), run_no)
            for rtt in a.rtts:
                self.proxies = {
                    "redis": TcpProxy(self.dsfs, self.workdir, self.redis.port, rtt, name="redis"),
                    "http": TcpProxy(self.dsfs, self.workdir, self.nginx.port, rtt, name="http")}
                try:
                    for peer in a.peers:
                        if peer != "tmpfs":
                            self.record(self.case(peer, rtt, seed), run_no)
                finally:
                    self.stop_proxies()

    def record(self, c, run_no):
        c["run"] = run_no
        self.results["cases"].append(c)
        rtt = "-" if c["rtt_ms"] is None else f"{c['rtt_ms']} ms"
        log(f"run {run_no + 1}, {c['peer']}, rtt {rtt}: " + ", ".join(
            f"epoch {i + 1} {e['files_per_s']:.0f}{'' if e['complete'] else '*'} files/s"
            + ("" if e["proxy"] is None else
               f" ({e['proxy']['bytes_to_client'] / 1e6:.0f} MB, "
               f"{e['proxy']['connections']} conn)")
            for i, e in enumerate(c["epochs"]))
            + ("" if c["listing_s"] is None else f"; listing {c['listing_s']:.1f} s"))
        self.save()

    def save(self):
        save_results(self.results, self.args.results_dir, self.args.name)


def proxy_counters(proxy):
    """The proxy's cumulative counters (its --stats-file, rewritten every second)."""
    time.sleep(1.1)
    with open(proxy.stats_file) as f:
        st = json.load(f)
    return {"bytes_to_client": st["bytes_to_client"], "bytes_to_upstream": st["bytes_to_upstream"],
            "connections": st["connections_accepted"]}


def stop_pid(pid, timeout=15):
    """Waits for a process that is not our child (the mount daemon) to exit after its unmount;
    SIGTERM, then SIGKILL, when it does not."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        try:
            if sig is not None:
                log(f"pid {pid} still running after its unmount; sending {sig.name}")
                os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return  # exited, not yet reaped
            except OSError:
                return
            time.sleep(0.05)


def versions():
    def first_line(args):
        try:
            res = subprocess.run(args, capture_output=True, text=True, timeout=30)
            return (res.stdout or res.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return None
    out = {"rclone": first_line(["rclone", "version"]), "nginx": first_line([NGINX, "-v"]),
           "redis-server": first_line(["redis-server", "--version"])}
    try:
        import redis
        out["redis-py"] = redis.__version__
    except ImportError:
        out["redis-py"] = None
    return out


# ---- report --------------------------------------------------------------------------------------

def summary(results, peer, rtt, epoch):
    """(median files/s, min, max, any run cut, median proxy MB, median reader+daemon µs/file) of
    one peer's epoch over the runs; None when not measured. tmpfs is the same at every RTT."""
    cs = [c for c in results["cases"] if c["peer"] == peer
          and (peer == "tmpfs" or c["rtt_ms"] == rtt) and len(c["epochs"]) > epoch]
    if not cs:
        return None
    es = [c["epochs"][epoch] for c in cs]
    fps = [e["files_per_s"] for e in es]
    mb = [e["proxy"]["bytes_to_client"] / 1e6 for e in es if e["proxy"]]
    conns = [e["proxy"]["connections"] for e in es if e["proxy"]]
    cpu = [e["reader_cpu_us_per_file"] + (c["daemon_cpu_us_per_file"] or 0)
           for c, e in zip(cs, es)]
    return {"files_per_s": median(fps), "min": min(fps), "max": max(fps),
            "cut": any(not e["complete"] for e in es), "proxy_mb": median(mb) if mb else None,
            "proxy_connections": median(conns) if conns else None,
            "listing_mb": median([c["listing_proxy"]["bytes_to_client"] / 1e6 for c in cs
                                  if c.get("listing_proxy")]) if cs[0].get("listing_proxy")
            else None,
            "listing_connections": median([c["listing_proxy"]["connections"] for c in cs
                                           if c.get("listing_proxy")])
            if cs[0].get("listing_proxy") else None,
            "cpu_us_per_file": median(cpu), "runs": len(es),
            "listing_s": median([c["listing_s"] for c in cs if c["listing_s"] is not None])
            if cs[0]["listing_s"] is not None else None}


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfg = results["config"]
    rtts = cfg["rtts"]
    fig, axes = plt.subplots(1, cfg["epochs"], figsize=(5.2 * cfg["epochs"], 3.8), sharey=True,
                             squeeze=False)
    styles = {"dsfs": ("tab:blue", "o"), "rclone": ("tab:orange", "s"),
              "redis-py": ("tab:green", "^")}
    for epoch, ax in enumerate(axes[0]):
        for peer in cfg["peers"]:
            if peer == "tmpfs":
                s = summary(results, peer, None, epoch)
                if s:
                    ax.axhline(s["files_per_s"], color="gray", linestyle="--",
                               label=PEER_LABELS[peer])
                continue
            xs, ys, lo, hi, cut = [], [], [], [], []
            for i, rtt in enumerate(rtts):
                s = summary(results, peer, rtt, epoch)
                if s:
                    xs.append(i)
                    ys.append(s["files_per_s"])
                    lo.append(s["files_per_s"] - s["min"])
                    hi.append(s["max"] - s["files_per_s"])
                    cut.append(s["cut"])
            color, marker = styles[peer]
            ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker=marker, capsize=3,
                        label=PEER_LABELS[peer])
            for x, y, c in zip(xs, ys, cut):
                ax.annotate(f"{y:,.0f}{'*' if c else ''}", (x, y), textcoords="offset points",
                            xytext=(5, -11) if peer == "rclone" else (5, 4), fontsize=7,
                            color=color)
        ax.set_xticks(range(len(rtts)), [f"{r} ms" for r in rtts])
        ax.set_xlabel("RTT added by dsfs proxy")
        ax.set_yscale("log")
        name = "epoch 1 (cold)" if epoch == 0 else f"epoch {epoch + 1} (steady)"
        ax.set_title(f"{name}, 8 threads, median of {cfg['runs']} (* = cut)", fontsize=9)
    axes[0][0].set_ylabel("files/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fmt_cell(s):
    if s is None:
        return "–"
    spread = (f" ({s['min']:,.0f}–{s['max']:,.0f})" if s["runs"] > 1 else "")
    return f"{s['files_per_s']:,.0f}{'*' if s['cut'] else ''}{spread}"


def markdown(results, name):
    cfg = results["config"]
    ds = results["dataset"]
    m = results["machine"]
    v = results["versions"]
    src = results["source"]
    load = results["load_average"]
    peers = [p for p in PEERS if p in cfg["peers"]]
    net = [p for p in peers if p != "tmpfs"]
    cache_mb = results["cache_bytes"] / 1e6
    lines = [DOCS_START, "",
             f"Generated by `bench/peers.py` on {m['date']}: {m['cpus']} CPUs ({m['cpu_model']}), "
             f"{m['memory_gib']} GiB RAM, load average {load['start']:.1f} at the start and "
             f"{load.get('end', 0):.1f} at the end."
             + (f" {cfg['note']}" if cfg.get("note") else "")
             + f" dsfs `{os.path.relpath(src.get('build', '?'), REPO)}` built from "
             f"{src.get('commit', '?')}{' + uncommitted changes' if src.get('uncommitted_changes') else ''}; "
             f"{v.get('rclone')}, {v.get('nginx')}, redis-py {v.get('redis-py')}, "
             f"{v.get('redis-server')}. Dataset: `dsfs synth`, {ds['files']:,} files, "
             f"{ds['bytes'] / 1e6:.0f} MB (mean {ds['mean_file_bytes'] / 1e3:.0f} KB), in tmpfs. "
             f"Cache budget {cfg['cache_percent']}% of the data ({cache_mb:.0f} MB) for dsfs "
             f"(`--cache-size`, memory) and rclone (`--vfs-cache-max-size`, disk). Reader: one "
             f"Python process per case, {JOBS} threads, a new shuffled order per epoch (the same "
             f"orders for every peer), page cache dropped before each epoch; epochs cut after "
             f"{cfg['epoch_seconds']} s (* = cut). Files/s, median of {cfg['runs']} run(s) "
             f"(min–max). Results: `bench/results/{name}.json`, plot `bench/results/{name}.png`. "
             f"Reproduce (root): `bench/peers.sh --build {cfg['build']} --files {cfg['files']} "
             f"--rtts {','.join(map(str, cfg['rtts']))} --runs {cfg['runs']} --epoch-seconds "
             f"{cfg['epoch_seconds']} --cache-percent {cfg['cache_percent']}`.", ""]
    header = "| RTT | epoch | " + " | ".join(PEER_LABELS[p] for p in peers) + " |"
    lines += [header, "|" + "---|" * (len(peers) + 2)]
    for rtt in cfg["rtts"]:
        for epoch in range(cfg["epochs"]):
            label = "1 (cold)" if epoch == 0 else f"{epoch + 1} (steady)"
            lines.append(f"| {rtt} ms | {label} | " + " | ".join(
                fmt_cell(summary(results, p, rtt, epoch)) for p in peers) + " |")
    eps = " / ".join(str(e + 1) for e in range(cfg["epochs"]))
    lines += ["", f"What each epoch cost (medians; epochs {eps}): MB and new connections through "
              "the proxy (from the remote server), the client's CPU per file (the reader "
              "process's in that epoch, plus for the mounts the FUSE daemon's, dsfs's or "
              "rclone's, averaged over the case's epochs), and the "
              "mount + listing before epoch 1 (not timed above).", "",
              "| RTT | peer | MB from the remote | connections | client CPU µs/file | "
              "mount + listing s (through the proxy) |", "|---|---|---|---|---|---|"]
    for rtt in cfg["rtts"]:
        for p in net:
            ss = [summary(results, p, rtt, e) for e in range(cfg["epochs"])]
            if not ss[0]:
                continue
            mb = " / ".join(f"{s['proxy_mb']:.0f}" if s and s["proxy_mb"] is not None else "?"
                            for s in ss)
            conn = " / ".join(f"{s['proxy_connections']:.0f}"
                              if s and s["proxy_connections"] is not None else "?" for s in ss)
            cpu = " / ".join(f"{s['cpu_us_per_file']:,.0f}" if s else "?" for s in ss)
            listing = "–"
            if ss[0]["listing_s"] is not None:
                listing = f"{ss[0]['listing_s']:.1f}"
                if ss[0].get("listing_connections") is not None:
                    listing += (f" ({ss[0]['listing_mb']:.1f} MB, "
                                f"{ss[0]['listing_connections']:.0f} conn)")
            lines.append(f"| {rtt} ms | {PEER_LABELS[p]} | {mb} | {conn} | {cpu} | {listing} |")
    t = summary(results, "tmpfs", None, 0)
    if t:
        lines += ["", f"tmpfs reader CPU: {t['cpu_us_per_file']:.0f} µs per file."]
    lines += ["", f"![dsfs beside the alternatives](../bench/results/{name}.png)", "",
              settings_paragraph(results), "", DOCS_END]
    return "\n".join(lines)


def settings_paragraph(results):
    cfg = results["config"]
    return (
        "Each peer's settings, and why. Every network peer sits behind its own `dsfs proxy "
        "--listen 127.0.0.1:0 --rtt R` (also at 0 ms, so all pay the same extra hop; "
        "`--realtime` from 10 ms) in front of a server holding the data in memory: Redis for "
        "dsfs and redis-py, nginx serving the tmpfs tree for rclone. "
        f"**dsfs**: `dsfs mount --cache-size` {cfg['cache_percent']}% of the data `--timeout "
        "300s`, defaults otherwise (`--prefetch auto`, no plan written, 8 prefetch connections, 16 FUSE threads), "
        "a fresh mount per case: what a user gets without tuning. "
        "**rclone**: `rclone mount :http: --http-url http://PROXY/ --read-only --vfs-cache-mode "
        "full --vfs-cache-max-size` (the same bytes as dsfs's `--cache-size`) `--cache-dir` (a "
        "new directory under /tmp, ext4 on the VM's disk, per case) `--dir-cache-time 1h`, "
        "defaults otherwise, with a temp `RCLONE_CONFIG` (no user config). `http` is the rclone "
        "backend that needs no object-store server, and plain nginx (`autoindex on`, `sendfile`, "
        "keep-alive) is the simplest honest server for it; `full` is the VFS mode rclone's docs "
        "recommend for reading files repeatedly, the one mode that keeps data across epochs; "
        "`--dir-cache-time 1h` keeps the listing (built before epoch 1, untimed, like dsfs's "
        "catalogue; it costs an index page per folder and a HEAD per file, so it grows with the "
        "RTT) for the whole case. Its cache is on disk and dsfs's in memory: that is each "
        "tool's design, and with the page cache dropped rclone's steady epoch reads ext4. "
        "**redis-py**: Debian's python3-redis, one `redis.Redis` shared by the 8 reader threads "
        "(its connection pool opens a connection per thread during epoch 1), one `GET` per "
        "sample, no pipelining or prefetching: the loader a user writes first (with redis-py's "
        "own Python reply parser: python3-hiredis is not installed). It reads the "
        f"same files stored under plain keys `{KEY_PREFIX}<relative path>` in the same "
        "redis-server (written once before the run, not timed), since dsfs's object keys are "
        "numbered by its catalogue; it has no cache, so its epoch 2 costs what epoch 1 did. "
        "**tmpfs**: the same reader on the dataset's tmpfs copy, no network and no FUSE: the "
        "bound for any loader on this machine (dropping the page cache does not empty tmpfs).")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 200 files, RTT 0 and 10 ms, one run, epochs cut at 20 s")
    p.add_argument("--build", default="build", help="build directory with dsfs (build)")
    p.add_argument("--files", type=int, default=None, help="dataset size (2,000; --quick 200)")
    p.add_argument("--rtts", default=None, help="RTTs in ms (0,10,100; --quick 0,10)")
    p.add_argument("--runs", type=int, default=None, help="runs of every case, median (3; "
                   "--quick 1)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per case (2: cold, steady)")
    p.add_argument("--epoch-seconds", type=int, default=None,
                   help="cut an epoch after this long (90; --quick 20)")
    p.add_argument("--cache-percent", type=int, default=125,
                   help="dsfs --cache-size and rclone --vfs-cache-max-size, percent of the "
                   "dataset's bytes (125: room for all of it)")
    p.add_argument("--peers", default=",".join(PEERS), help=",".join(PEERS))
    p.add_argument("--data-dir", default="/dev/shm/dsfs-peers-data",
                   help="tmpfs directory for the dataset (its own, so that other benchmarks' "
                   "clean-up never removes it mid-run)")
    p.add_argument("--keep-data", action="store_true")
    p.add_argument("--note", default="", help="a sentence for the docs (e.g. the machine was "
                   "shared)")
    p.add_argument("--name", default="peers")
    p.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: redraw the plot and docs section from NAME.json")
    args = p.parse_args()
    if args.report_only:
        with open(os.path.join(args.results_dir, f"{args.name}.json")) as f:
            results = json.load(f)
        plot(results, os.path.join(args.results_dir, f"{args.name}.png"))
        show_docs_section(markdown(results, args.name), (DOCS_START, DOCS_END, DOCS_HEADING),
                          not args.no_docs)
        return
    require_root()
    q = args.quick
    args.files = args.files or (200 if q else 2000)
    args.runs = args.runs or (1 if q else 3)
    args.rtts = [int(x) for x in (args.rtts or ("0,10" if q else "0,10,100")).split(",")]
    args.epoch_seconds = args.epoch_seconds or (20 if q else 90)
    args.peers = [x for x in args.peers.split(",") if x]
    check_choices(args.peers, PEERS, "peer")
    args.peers = [x for x in PEERS if x in args.peers]
    interrupt_on_signals()
    bench = Bench(args)
    bench.results["wall_s"] = round(run_bench(bench), 1)
    png = publish_results(bench, plot, markdown, (DOCS_START, DOCS_END, DOCS_HEADING))
    log(f"results: {args.results_dir}/{args.name}.json, {png} ({bench.results['wall_s']} s)")


if __name__ == "__main__":
    main()
