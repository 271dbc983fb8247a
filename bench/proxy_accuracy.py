#!/usr/bin/python3
"""How closely `dsfs proxy` holds its target RTT, and what it costs at 0 ms.

For each target RTT (default 0, 1, 10, 50 and 100 ms) a `dsfs proxy` runs between the clients
and a fresh redis-server holding one 100 KB value, and:

- idle: probe connections send PINGs one at a time for a few seconds (each probe's first PING,
  which also pays the emulated TCP handshake, is not counted): the measured RTT's p50 and p99
  against the target;
- loaded: the same probes while redis-benchmark runs 50 connections of GETs of the 100 KB value
  through the proxy; also redis-benchmark's GET/s and p50 (its p99 includes each connection's
  first GET, which pays the emulated handshake: one more RTT);
- the proxy's own release lateness (how long after its due time each piece left), from the
  --stats line it logs on exit.

The same is measured straight against Redis ("direct"), and at 0 ms also with a unix-socket
upstream. Each target is measured with the proxy at normal priority and with --realtime
(SCHED_FIFO), which on a busy machine keeps the proxy from waiting up to a scheduler tick for a
CPU.
Runs repeat (--runs) interleaved; the JSON keeps every run, the pooled percentiles and the
medians of the redis-benchmark figures.
Writes bench/results/proxy_accuracy.json and .png.

    bench/proxy_accuracy.py [--build build] [--rtts 0,1,10,50,100] [--runs 3]
                            [--modes normal,realtime]
"""
import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VALUE_BYTES = 100_000
LOAD_CONNECTIONS = 50
PROBES = 8
LATENESS_RE = re.compile(
    r"release lateness mean ([0-9.]+) ms, p99 < ([0-9.]+) ms, max ([0-9.]+) ms")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def wait_for(predicate, what, limit=10.0):
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Redis:
    def __init__(self, workdir):
        self.port = free_port()
        self.socket_path = os.path.join(workdir, "redis.sock")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--unixsocket", self.socket_path,
             "--save", "", "--appendonly", "no", "--dir", workdir, "--maxclients", "1000"],
            stdout=subprocess.DEVNULL)
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(self.port), "PING"],
                                        capture_output=True, text=True).stdout.strip() == "PONG",
                 "redis-server")
        # redis-benchmark without -r uses the literal key "key:__rand_int__" for SET and GET.
        subprocess.run(["redis-benchmark", "-p", str(self.port), "-t", "set", "-d",
                        str(VALUE_BYTES), "-n", "10", "-c", "1", "-q"], check=True,
                       stdout=subprocess.DEVNULL)
        size = subprocess.run(["redis-cli", "-p", str(self.port), "STRLEN", "key:__rand_int__"],
                              capture_output=True, text=True).stdout.strip()
        if size != str(VALUE_BYTES):
            raise RuntimeError(f"the benchmark value is {size} bytes, not {VALUE_BYTES}")

    def stop(self):
        self.process.terminate()
        self.process.wait()


class Proxy:
    """`dsfs proxy` on a free port; stop() returns its final --stats line's lateness."""

    def __init__(self, dsfs, workdir, upstream, rtt_ms, realtime):
        port_file = os.path.join(workdir, "proxy.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        self.stderr = open(os.path.join(workdir, "proxy.log"), "w+")
        self.process = subprocess.Popen(
            [dsfs, "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
             "--rtt", f"{rtt_ms}ms", "--port-file", port_file, "--stats", "3600s"]
            + (["--realtime"] if realtime else []),
            stdout=subprocess.DEVNULL, stderr=self.stderr)
        wait_for(lambda: os.path.exists(port_file) or self.process.poll() is not None,
                 "dsfs proxy")
        if self.process.poll() is not None:
            raise RuntimeError("dsfs proxy exited: " + self.log())
        with open(port_file) as f:
            self.port = int(f.read())

    def log(self):
        self.stderr.seek(0)
        return self.stderr.read()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        if self.process.wait(timeout=30) != 0:
            raise RuntimeError("dsfs proxy did not exit cleanly: " + self.log())
        found = LATENESS_RE.findall(self.log())
        self.stderr.close()
        if not found:
            return None
        mean, p99, worst = (float(x) for x in found[-1])
        return {"mean_ms": mean, "p99_below_ms": p99, "max_ms": worst}


def probe(port, stop, samples):
    """PINGs one at a time until `stop` is set, appending each RTT in ms after the first."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        first = True
        while not stop.is_set():
            start = time.perf_counter()
            s.sendall(b"PING\r\n")
            reply = b""
            while len(reply) < 7:
                chunk = s.recv(64)
                if not chunk:
                    raise RuntimeError("the probe connection was closed")
                reply += chunk
            elapsed_ms = (time.perf_counter() - start) * 1e3
            if reply != b"+PONG\r\n":
                raise RuntimeError(f"unexpected reply {reply!r}")
            if not first:
                samples.append(elapsed_ms)
            first = False
            time.sleep(random.uniform(0, 0.002))  # no lock-step between the probes


def run_probes(port, seconds=None, until=None):
    stop = threading.Event()
    samples = []
    errors = []

    def body():
        try:
            probe(port, stop, samples)
        except Exception as e:  # reported below, after the others stop
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=body) for _ in range(PROBES)]
    for t in threads:
        t.start()
    if until is not None:
        until()
    else:
        time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return samples


def redis_benchmark(args, requests):
    out = subprocess.run(["redis-benchmark", *args, "-t", "get", "-d", str(VALUE_BYTES),
                          "-c", str(LOAD_CONNECTIONS), "-n", str(requests), "--csv"],
                         check=True, capture_output=True, text=True).stdout
    header, row = [line.replace('"', "").split(",") for line in out.strip().splitlines()[-2:]]
    fields = dict(zip(header, row))
    return {"get_per_s": float(fields["rps"]), "p50_ms": float(fields["p50_latency_ms"]),
            "p99_ms": float(fields["p99_latency_ms"])}


def requests_for(rtt_ms, seconds):
    # About `seconds` of load: 50 connections, each GET about rtt + 3.5 ms at this size.
    return max(500, min(40000, int(LOAD_CONNECTIONS * seconds / ((rtt_ms + 3.5) / 1e3))))


def measure(target_args, probe_port, rtt_ms, idle_seconds, load_seconds):
    idle = run_probes(probe_port, seconds=idle_seconds)
    result = {}

    def load():
        time.sleep(0.2)
        result.update(redis_benchmark(target_args, requests_for(rtt_ms, load_seconds)))

    loaded = run_probes(probe_port, until=load)
    return {"idle_samples_ms": idle, "loaded_samples_ms": loaded, "redis_benchmark": result}


def summarize(runs, target_ms):
    idle = [x for r in runs for x in r["idle_samples_ms"]]
    loaded = [x for r in runs for x in r["loaded_samples_ms"]]
    summary = {
        "target_ms": target_ms,
        "idle": {"p50_ms": percentile(idle, 0.5), "p99_ms": percentile(idle, 0.99),
                 "samples": len(idle)},
        "loaded": {"p50_ms": percentile(loaded, 0.5), "p99_ms": percentile(loaded, 0.99),
                   "samples": len(loaded)},
        "redis_benchmark": {key: median([r["redis_benchmark"][key] for r in runs])
                            for key in ("get_per_s", "p50_ms", "p99_ms")},
    }
    lateness = [r["proxy_lateness"] for r in runs if r.get("proxy_lateness")]
    if lateness:
        summary["proxy_lateness"] = {
            "mean_ms": median([x["mean_ms"] for x in lateness]),
            "p99_below_ms": max(x["p99_below_ms"] for x in lateness),
            "max_ms": max(x["max_ms"] for x in lateness),
        }
    return summary


MODES = ("normal", "realtime")
MODE_STYLE = {"normal": ("tab:blue", "o"), "realtime": ("tab:orange", "s")}


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    direct = results["direct"]
    fig, (excess, late, rate) = plt.subplots(1, 3, figsize=(17, 4.8))
    for mode, rows in results["proxy"].items():
        color, marker = MODE_STYLE[mode]
        names = [f"{r['target_ms']:g}" for r in rows]
        for phase, line in (("idle", "-"), ("loaded", "--")):
            excess.plot(names, [r[phase]["p99_ms"] - r["target_ms"] for r in rows], line,
                        color=color, marker=marker, label=f"{mode}: {phase} p99")
        excess.plot(names, [r["loaded"]["p50_ms"] - r["target_ms"] for r in rows], ":",
                    color=color, marker=marker, label=f"{mode}: loaded p50")
        late.plot(names, [r["proxy_lateness"]["p99_below_ms"] for r in rows], "-",
                  color=color, marker=marker, label=f"{mode}: p99 below")
        late.plot(names, [r["proxy_lateness"]["max_ms"] for r in rows], "--", color=color,
                  marker=marker, label=f"{mode}: max")
    for phase, line in (("idle", "-"), ("loaded", "--")):
        excess.axhline(direct[phase]["p99_ms"], color="grey", linestyle=line, linewidth=1,
                       label=f"direct: {phase} p99")
    excess.axhline(1, color="black", linewidth=0.6, linestyle=":")
    excess.set_xlabel("target RTT (ms)")
    excess.set_ylabel("PING RTT - target (ms)")
    excess.set_title("PING probes above the target RTT\n"
                     "(loaded: redis-benchmark, 50 connections of 100 KB GETs)")
    excess.legend(fontsize=7)
    late.axhline(1, color="black", linewidth=0.6, linestyle=":")
    late.set_yscale("log")
    late.set_xlabel("target RTT (ms)")
    late.set_ylabel("ms after the due time")
    late.set_title("The proxy's own release lateness\n(its --stats, idle and loaded phases)")
    late.legend(fontsize=7)

    targets = [f"{r['target_ms']:g} ms" for r in next(iter(results["proxy"].values()))]
    width = 0.4
    rate.bar([-1], [direct["redis_benchmark"]["get_per_s"]], width * 2, color="grey",
             label="direct")
    for i, (mode, rows) in enumerate(results["proxy"].items()):
        xs = [x + (i - 0.5) * width for x in range(len(rows))]
        values = [r["redis_benchmark"]["get_per_s"] for r in rows]
        rate.bar(xs, values, width, color=MODE_STYLE[mode][0], label=mode)
        for x, v in zip(xs, values):
            rate.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    rate.text(-1, direct["redis_benchmark"]["get_per_s"],
              f"{direct['redis_benchmark']['get_per_s']:,.0f}", ha="center", va="bottom",
              fontsize=7)
    rate.set_xticks(range(-1, len(targets)), ["direct"] + targets)
    rate.set_yscale("log")
    rate.set_ylabel("GET/s (100 KB values, 50 connections)")
    rate.set_title("redis-benchmark GET/s through the proxy\n(median of runs)")
    rate.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rtts", default="0,1,10,50,100", help="target RTTs in ms")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="proxy priorities to compare: normal, realtime (--realtime)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=1.0)
    ap.add_argument("--load-seconds", type=float, default=2.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "proxy_accuracy"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args()
    if args.plot_only:
        with open(args.out + ".json") as f:
            plot(json.load(f), args.out + ".png")
        return
    dsfs = os.path.abspath(os.path.join(args.build, "dsfs"))
    rtts = [float(x) for x in args.rtts.split(",")]
    modes = args.modes.split(",")
    load_before = os.getloadavg()  # other work on a shared machine shows in every figure
    workdir = tempfile.mkdtemp(prefix="dsfs-bench-proxy-")
    redis = Redis(workdir)
    direct_runs, unix_runs = [], []
    proxy_runs = {mode: {rtt: [] for rtt in rtts} for mode in modes}
    try:
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}: direct", flush=True)
            direct_runs.append(measure(["-p", str(redis.port)], redis.port, 0,
                                       args.idle_seconds, args.load_seconds))
            for rtt in rtts:
                for mode in modes:
                    print(f"run {run + 1}/{args.runs}: rtt {rtt:g} ms, {mode}", flush=True)
                    proxy = Proxy(dsfs, workdir, f"127.0.0.1:{redis.port}", rtt,
                                  mode == "realtime")
                    try:
                        result = measure(["-p", str(proxy.port)], proxy.port, rtt,
                                         args.idle_seconds, args.load_seconds)
                    finally:
                        lateness = proxy.stop()
                    result["proxy_lateness"] = lateness
                    proxy_runs[mode][rtt].append(result)
            # At 0 ms with Redis on its unix socket: the proxy's cost without a second TCP hop.
            proxy = Proxy(dsfs, workdir, f"unix:{redis.socket_path}", 0, False)
            try:
                unix_runs.append({
                    "direct_unix": redis_benchmark(["-s", redis.socket_path],
                                                   requests_for(0, args.load_seconds)),
                    "proxy": redis_benchmark(["-p", str(proxy.port)],
                                             requests_for(0, args.load_seconds)),
                })
            finally:
                proxy.stop()
    finally:
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    direct = summarize(direct_runs, 0)
    rows = {mode: [summarize(proxy_runs[mode][rtt], rtt) for rtt in rtts] for mode in modes}
    direct_get = direct["redis_benchmark"]["get_per_s"]
    results = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "settings": {"value_bytes": VALUE_BYTES, "load_connections": LOAD_CONNECTIONS,
                     "probes": PROBES, "runs": args.runs, "idle_seconds": args.idle_seconds,
                     "load_seconds": args.load_seconds, "modes": modes,
                     "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "direct": direct,
        "proxy": rows,
        "rtt0_get_ratio_proxy_vs_direct": {
            mode: next(r["redis_benchmark"]["get_per_s"] / direct_get
                       for r in rows[mode] if r["target_ms"] == 0)
            for mode in modes if 0 in rtts},
        "unix_upstream": {
            "direct_unix_get_per_s": median([r["direct_unix"]["get_per_s"] for r in unix_runs]),
            "proxy_get_per_s": median([r["proxy"]["get_per_s"] for r in unix_runs]),
        },
        "raw": {"direct": direct_runs,
                "proxy": {mode: {f"{k:g}": v for k, v in runs.items()}
                          for mode, runs in proxy_runs.items()},
                "unix_upstream": unix_runs},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, args.out + ".png")

    print(f"{'':>9} {'target':>7} {'idle p50':>9} {'idle p99':>9} {'load p50':>9} "
          f"{'load p99':>9} {'GET/s':>8} {'late p99<':>9} {'late max':>9}")
    table = [("direct", dict(direct, target_ms=0))] + [
        (mode, r) for mode in modes for r in rows[mode]]
    for mode, r in table:
        lateness = r.get("proxy_lateness", {})
        print(f"{mode:>9} {r['target_ms']:7g} {r['idle']['p50_ms']:9.3f} "
              f"{r['idle']['p99_ms']:9.3f} {r['loaded']['p50_ms']:9.3f} "
              f"{r['loaded']['p99_ms']:9.3f} {r['redis_benchmark']['get_per_s']:8.0f} "
              f"{lateness.get('p99_below_ms', float('nan')):9.3f} "
              f"{lateness.get('max_ms', float('nan')):9.3f}")
    for mode, ratio in results["rtt0_get_ratio_proxy_vs_direct"].items():
        print(f"GET/s at 0 ms through the proxy ({mode}) / direct: {ratio:.2f}")
    u = results["unix_upstream"]
    print(f"unix upstream at 0 ms: proxy {u['proxy_get_per_s']:.0f} GET/s, direct unix "
          f"{u['direct_unix_get_per_s']:.0f} GET/s")
    print(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
