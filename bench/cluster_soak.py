#!/usr/bin/python3
"""Resharding and failovers for longer (issue 12): a local Redis Cluster of 3 primaries and 3
replicas (`dsfs server start --shards 3 --replicas 1`) under two mounts, one reading from the
primaries and one with --read-from replica, 64 readers each checking every file against the
source's SHA-256, while the cluster changes under them one event after another until --minutes
are up: slots moved between two primaries (`redis-cli --cluster reshard`), a primary killed
(SHUTDOWN NOSAVE; its replica is promoted, then the killed node is started again and rejoins as
a replica), and a manual failover (CLUSTER FAILOVER on a replica: the two swap roles). The CI
tests (tests/integration/test_cluster.py) make one reshard and one kill; this makes dozens.

Checks: no wrong byte on either mount; no failed read on the replica mount, nor on the primary
mount (--timeout 30s covers a failover of a 2 s cluster-node-timeout); no reader hung; reads go
on after every event; each daemon's RSS within its cache plus the soak's slack; its threads
and sockets not growing from event to event.

Writes bench/results/NAME.json (checks, events, a timeline of one sample a second: each
mount's reads, RSS, threads, sockets, and the longest READ its daemon has stalled so far) and
NAME.png (files read per second on each mount, the events shaded; each daemon's RSS and
sockets). Exit 1 if a check failed. Root (FUSE mounts).

    nice -n 10 bench/cluster_soak.py [--minutes 10] [--build build] [--out bench/results]
                                     [--name cluster_soak] [--seed 1]
    bench/cluster_soak.py --replot      # redraw NAME.png from NAME.json
"""
import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

CACHE_BYTES = 8 << 20
NODE_TIMEOUT_MS = 2000
MOUNT_TIMEOUT = "30s"
# Reads on after an event: this many files read whole by each mount, within the deadline.
PROGRESS_FILES = 30
PROGRESS_DEADLINE_S = 60
MOUNTS = ("primary", "replica")
SLOW_CALL_S = 1.0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10, help="time under events (default 10)")
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                        help="build directory holding the dsfs binary")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="where NAME.json and NAME.png go")
    parser.add_argument("--name", default="cluster_soak",
                        help="results are NAME.json and NAME.png (default cluster_soak)")
    parser.add_argument("--seed", type=int, default=1, help="picks the events and their nodes")
    parser.add_argument("--events", default="reshard,kill,failover",
                        help="the kinds of event to make, comma-separated (default all three)")
    parser.add_argument("--mount-log-level", default="info",
                        help="the mounts' --log-level; with another level than info, or "
                             "when a check fails, their logs are kept as "
                             "NAME-mount-{primary,replica}.log in --out")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw NAME.png from the NAME.json in --out")
    return parser.parse_args()


def cli(port, *args, check=True, timeout=60):
    out = subprocess.run(["redis-cli", "-p", str(port), *map(str, args)], capture_output=True,
                         text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"redis-cli -p {port} {' '.join(map(str, args))}: {out.stderr}")
    return out.stdout.strip()


def role(port):
    """'master', 'slave', or None when the node does not answer."""
    try:
        out = cli(port, "ROLE", check=False, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    first = out.splitlines()[0] if out else ""
    return first if first in ("master", "slave") else None


def slots_of(port):
    """How many slots the node at `port` serves (its own line of CLUSTER NODES)."""
    for line in cli(port, "CLUSTER", "NODES").splitlines():
        fields = line.split()
        if "myself" in fields[2]:
            count = 0
            for r in fields[8:]:
                if r.startswith("["):
                    continue  # a slot importing or migrating
                first, _, last = r.partition("-")
                count += int(last or first) - int(first) + 1
            return count
    raise RuntimeError(f"node {port}: no 'myself' line in CLUSTER NODES")


def listed_replicas(port):
    """How many replicas the node at `port` lists in CLUSTER SLOTS, one per shard at most."""
    shards = {}
    out = subprocess.run(["redis-cli", "-p", str(port), "--json", "CLUSTER", "SLOTS"],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        return 0
    for entry in json.loads(out.stdout or "[]"):
        primary = tuple(entry[2][:2])
        shards[primary] = max(shards.get(primary, 0), min(len(entry) - 3, 1))
    return sum(shards.values())


class Cluster:
    """The local cluster in its own DSFS_HOME, and the events made to it."""

    def __init__(self, harness, tmp):
        self.harness = harness
        self.env = dict(os.environ, DSFS_HOME=os.path.join(tmp, "home"))
        self.env.pop("DSFS_REDIS", None)
        self.ports = []

    def server(self, *args):
        return self.harness.run([self.harness.DSFS, "server", *args], env=self.env, timeout=300)

    def start(self):
        self.server("start", "--shards", "3", "--replicas", "1")
        status = self.server("status").stdout
        self.ports = sorted({int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", status)})
        for port in self.ports:
            cli(port, "CONFIG", "SET", "cluster-node-timeout", str(NODE_TIMEOUT_MS))
        return f"redis://127.0.0.1:{self.ports[0]}"

    def stop(self):
        subprocess.run([self.harness.DSFS, "server", "stop"], env=self.env, capture_output=True,
                       timeout=120)
        for port in self.ports:  # any node left behind by a failure
            subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"],
                           capture_output=True, timeout=30)

    def by_role(self):
        roles = {port: role(port) for port in self.ports}
        return ([p for p, r in roles.items() if r == "master"],
                [p for p, r in roles.items() if r == "slave"])

    def wait_healthy(self, timeout=120):
        """Every node up, 3 primaries each with a replica whose link is up, and every node
        agreeing on the slots (`redis-cli --cluster check`)."""
        def healthy():
            primaries, replicas = self.by_role()
            if len(primaries) != 3 or len(replicas) != 3:
                return False
            for port in replicas:
                if "master_link_status:up" not in cli(port, "INFO", "replication", check=False):
                    return False
            # Listed as replicas by every node: Redis leaves a replica out of CLUSTER SLOTS
            # until the others have heard (by gossip) that it replicated something, and a
            # client's map is what CLUSTER SLOTS says.
            for port in primaries + replicas:
                if listed_replicas(port) != 3:
                    return False
            check = subprocess.run(["redis-cli", "--cluster", "check",
                                    f"127.0.0.1:{primaries[0]}"],
                                   capture_output=True, text=True, timeout=60)
            return check.returncode == 0 and "[ERR]" not in check.stdout
        self.harness.wait_for(healthy, timeout, "the cluster whole again (3 + 3, slots agreed)")

    def reshard(self, rng):
        primaries, _ = self.by_role()
        # From the primary with the most slots, never all of them: a primary left with none
        # becomes a replica (Redis 7), and the soak keeps three shards.
        owned = {p: slots_of(p) for p in primaries}
        src = max(primaries, key=lambda p: owned[p])
        dst = rng.choice([p for p in primaries if p != src])
        slots = min(rng.randint(200, 1500), owned[src] - 100)
        ids = {p: cli(p, "CLUSTER", "MYID") for p in (src, dst)}
        self.harness.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{src}",
                          "--cluster-from", ids[src], "--cluster-to", ids[dst],
                          "--cluster-slots", str(slots), "--cluster-yes"],
                         timeout=600, stdin=subprocess.DEVNULL)  # never a prompt to wait at
        return {"from": src, "to": dst, "slots": slots}

    def kill_primary(self, rng):
        primaries, _ = self.by_role()
        victim = rng.choice(primaries)
        cli(victim, "SHUTDOWN", "NOSAVE", check=False)
        killed = time.monotonic()
        self.harness.wait_for(
            lambda: len([p for p in self.ports if p != victim and role(p) == "master"]) == 3,
            60, "a replica's promotion")
        promoted_s = time.monotonic() - killed
        # Back as a replica of the promoted node (same ports, nodes.conf and data).
        self.server("start", "--shards", "3", "--replicas", "1")
        cli(victim, "CONFIG", "SET", "cluster-node-timeout", str(NODE_TIMEOUT_MS))
        return {"killed": victim, "promoted_after_s": round(promoted_s, 2)}

    def manual_failover(self, rng):
        _, replicas = self.by_role()
        replica = rng.choice(replicas)
        # Redis gives a manual failover 5 s to complete and then drops it (its log: "Manual
        # failover timed out"), e.g. when the replica has not caught up: asked again, up to 3
        # times, before the soak calls it failed.
        for attempt in range(1, 4):
            cli(replica, "CLUSTER", "FAILOVER")
            try:
                self.harness.wait_for(lambda: role(replica) == "master", 15,
                                      f"replica {replica} to take over (CLUSTER FAILOVER)")
                return {"promoted": replica, "attempts": attempt}
            except Exception:
                if attempt == 3:
                    raise

    def keep_logs(self, dest):
        """Copies every node's redis.log into `dest` (after a failed event)."""
        root = os.path.join(self.env["DSFS_HOME"], "cluster")
        for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            log_file = os.path.join(root, entry, "redis.log")
            if os.path.isfile(log_file):
                os.makedirs(dest, exist_ok=True)
                shutil.copy(log_file, os.path.join(dest, f"{entry}.log"))


def slow_readers(soak, began):
    """soak.Readers that also keep every call slower than SLOW_CALL_S: (ended at, took, what),
    seconds from `began`, so that a stall can be put beside the event that made it."""
    class SlowReaders(soak.Readers):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.slow_calls = []

        def _timed(self, what, fn, *args):
            start = time.monotonic()
            try:
                return super()._timed(what, fn, *args)
            finally:
                end = time.monotonic()
                if end - start > SLOW_CALL_S:
                    with self.lock:
                        self.slow_calls.append((round(end - began, 2), round(end - start, 2),
                                                what))
    return SlowReaders


def daemon_stall_max_ms(mnt):
    """The longest a READ has waited in the mount's daemon for its bytes since the mount
    (stats.json prefetch.stall_us.max), in ms; None if stats.json could not be read. A reader's
    slow call with no stall as long in the daemon waited elsewhere (the kernel's FUSE queue, the
    harness's own threads)."""
    try:
        with open(os.path.join(mnt, ".dsfs", "stats.json")) as f:
            return round(json.load(f)["prefetch"]["stall_us"]["max"] / 1000, 1)
    except (OSError, ValueError, KeyError):
        return None


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["timeline"]
    t = [p["t"] for p in timeline]
    fig, (rates, memory, sockets) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    for name in MOUNTS:
        points = [(b["t"], (b[name]["ok_files"] - a[name]["ok_files"]) / (b["t"] - a["t"]))
                  for a, b in zip(timeline, timeline[1:]) if b["t"] > a["t"]]
        rates.plot([x for x, _ in points], [y for _, y in points], linewidth=0.8,
                   label=f"{name} mount: files read whole /s")
        memory.plot(t, [p[name]["rss"] / 2**20 for p in timeline], label=f"{name} mount")
        sockets.plot(t, [p[name]["sockets"] for p in timeline], label=f"{name} mount")
    memory.axhline(result["rss_bound"] / 2**20, color="red", linestyle="--",
                   label="bound: cache + slack")
    rates.set_ylabel("per second")
    memory.set_ylabel("daemon RSS, MiB")
    sockets.set_ylabel("daemon sockets")
    sockets.set_xlabel("seconds")
    colors = {"reshard": "tab:blue", "kill": "tab:red", "failover": "tab:green"}
    for axis in (rates, memory, sockets):
        for e in result["events"]:
            axis.axvspan(e["began_s"], e["ended_s"], color=colors[e["kind"]], alpha=0.2)
        axis.legend(loc="lower right")
    fig.suptitle(f"dsfs on a Redis Cluster under events, {result['seconds']:.0f} s; shaded: "
                 "blue reshard, red primary killed, green manual failover")
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

    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="dsfs-cluster-soak-")
    cluster = Cluster(harness, tmp)
    mounts = {name: os.path.join(tmp, f"mnt-{name}") for name in MOUNTS}
    readers = {}
    events, failures, timeline = [], [], []
    stop_sampling = threading.Event()
    began = time.monotonic()
    try:
        url = cluster.start()
        data = os.path.join(tmp, "data")
        expected = soak.synth_dataset(data)
        harness.run([harness.DSFS, "ingest", data, "--dataset", "ds", "--chunk-size", "1MiB",
                     "--redis", url], env=cluster.env)
        cluster.wait_healthy()
        for name, mnt in mounts.items():
            os.makedirs(mnt)
            harness.run([harness.DSFS, "mount", mnt, "--redis", url, "--cache-size",
                         str(CACHE_BYTES), "--timeout", MOUNT_TIMEOUT, "--prefetch", "auto",
                         "--read-from", name, "--log-level", args.mount_log_level,
                         "--log-file", os.path.join(tmp, f"mount-{name}.log")],
                        env=cluster.env)
        pids = {name: soak.mount_daemon_pid(mnt) for name, mnt in mounts.items()}
        readers = {name: slow_readers(soak, began)(mnt, "ds", expected, seed=i + 3)
                   for i, (name, mnt) in enumerate(mounts.items())}
        for r in readers.values():
            r.start()

        def sample():
            point = {"t": round(time.monotonic() - began, 2)}
            for name in MOUNTS:
                point[name] = readers[name].snapshot()
                point[name].update({k: v for k, v in soak.process_sample(pids[name]).items()
                                    if k != "other_fds"})
                point[name]["daemon_stall_max_ms"] = daemon_stall_max_ms(mounts[name])
            return point

        def sample_loop():
            while not stop_sampling.wait(1.0):
                timeline.append(sample())

        sampler = threading.Thread(target=sample_loop, daemon=True)
        sampler.start()
        harness.wait_for(lambda: all(r.snapshot()["ok_files"] >= PROGRESS_FILES
                                     for r in readers.values()), 60, "reads under way")
        first = sample()
        deadline = time.monotonic() + args.minutes * 60
        kinds = {"reshard": cluster.reshard, "kill": cluster.kill_primary,
                 "failover": cluster.manual_failover}
        kinds = {k: kinds[k] for k in args.events.split(",")}
        while time.monotonic() < deadline:
            kind = rng.choice(sorted(kinds))
            event = {"kind": kind, "began_s": round(time.monotonic() - began, 2)}
            print(f"[{event['began_s']:7.1f} s] {kind} ...", flush=True)
            try:
                event.update(kinds[kind](rng))
                cluster.wait_healthy()
            except Exception as e:  # the cluster's tooling failed: reported, the soak stops
                event["error"] = str(e)[-2000:]
                cluster.keep_logs(os.path.join(args.out, f"{args.name}-node-logs"))
                failures.append(f"{kind} at {event['began_s']} s did not complete: {e}")
            event["ended_s"] = round(time.monotonic() - began, 2)
            # Reads on after the event, on both mounts.
            after = {name: r.snapshot()["ok_files"] for name, r in readers.items()}
            for name, r in readers.items():
                try:
                    harness.wait_for(
                        lambda: r.snapshot()["ok_files"] >= after[name] + PROGRESS_FILES,
                        PROGRESS_DEADLINE_S, f"reads on the {name} mount after the {kind}")
                except Exception as e:
                    failures.append(f"{name} mount: no progress after {kind} at "
                                    f"{event['began_s']} s: {e}")
            event["snapshot"] = {name: r.snapshot() for name, r in readers.items()}
            events.append(event)
            print(f"[{event['ended_s']:7.1f} s] {kind} done: "
                  f"{ {k: v for k, v in event.items() if k not in ('kind', 'snapshot')} }; "
                  f"{event['snapshot']}", flush=True)
            if "error" in event:
                break
        last = sample()
    finally:
        stop_sampling.set()
        hung = [name for name, r in readers.items() if not r.stop(60)]
        for mnt in mounts.values():
            if harness.is_mounted(mnt):
                subprocess.run([harness.DSFS, "umount", mnt], capture_output=True)
        cluster.stop()
        mount_logs = {}
        for name in MOUNTS:
            log_file = os.path.join(tmp, f"mount-{name}.log")
            if os.path.isfile(log_file):
                with open(log_file, errors="replace") as f:
                    mount_logs[name] = f.read()
        shutil.rmtree(tmp, ignore_errors=True)

    rss_bound = CACHE_BYTES + soak.RSS_SLACK
    for name in hung:
        failures.append(f"a reader of the {name} mount hung")
    for name, r in readers.items():
        if r.wrong:
            failures.append(f"{name} mount: {len(r.wrong)} wrong reads, first {r.wrong[:3]}")
        if sum(r.errors.values()):
            failures.append(f"{name} mount: failed reads {dict(r.errors)}")
        max_rss = max(p[name]["rss"] for p in timeline)
        if max_rss > rss_bound:
            failures.append(f"{name} mount: RSS {max_rss >> 20} MiB above {rss_bound >> 20} MiB")
        # Every node's connections are kept, dropped and made again as nodes come and go: the
        # count after as many events as these is the count at the start, give or take one
        # node's share; a leak grows with the events.
        for key in ("sockets", "threads"):
            if last[name][key] > 2 * first[name][key]:
                failures.append(f"{name} mount: {key} {first[name][key]} -> {last[name][key]} "
                                f"over {len(events)} events")
    result = {
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "load_average_after": os.getloadavg()},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": timeline[-1]["t"] if timeline else 0,
        "readers_per_mount": soak.READERS, "files": len(expected),
        "dataset_bytes": sum(size for size, _ in expected.values()),
        "cache_bytes": CACHE_BYTES, "rss_bound": rss_bound, "mount_timeout": MOUNT_TIMEOUT,
        "cluster_node_timeout_ms": NODE_TIMEOUT_MS,
        "events_by_kind": {k: sum(1 for e in events if e["kind"] == k)
                           for k in ("reshard", "kill", "failover")},
        "totals": {name: {"ok_files": r.ok_files, "ok_bytes": r.ok_bytes,
                          "wrong": len(r.wrong), "errors": dict(r.errors),
                          "slowest_call_s": round(r.slowest_call_s, 2),
                          "slowest_call": r.slowest_call,
                          "slow_calls": r.slow_calls,
                          "daemon_stall_max_ms": max(
                              (p[name]["daemon_stall_max_ms"] or 0 for p in timeline),
                              default=0)} for name, r in readers.items()},
        "first": first, "last": last, "passed": not failures, "failures": failures,
        "events": events, "timeline": timeline,
    }
    os.makedirs(args.out, exist_ok=True)
    # The mounts' logs are kept when asked for (--mount-log-level) or when a check failed.
    if failures or args.mount_log_level != "info":
        for name, text in mount_logs.items():
            with open(os.path.join(args.out, f"{args.name}-mount-{name}.log"), "w") as f:
                f.write(text)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(args.out, f"{args.name}.png"))
    print(json.dumps({k: result[k] for k in ("events_by_kind", "totals", "first", "last")},
                     indent=1))
    print("PASSED" if not failures else "FAILED:\n  " + "\n  ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
