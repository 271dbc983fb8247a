"""Soak under injected faults: 64 reader threads read a mount whose Redis sits behind
`dsfs proxy` injecting connection resets (at random and after N bytes), truncated replies,
stalls and refused connects, while Redis is restarted once in the middle (same data, from its
append-only file). Every read is checked against the source files' SHA-256, computed by this
test from the bytes it ingested, so a wrong byte is caught whether or not the mount verifies.

Asserted, for `--verify` off and on:
- zero wrong bytes: every open/fstat/read-to-EOF that succeeds returns exactly the source;
- every failure is EIO, and no single open, fstat or read takes longer than the hang guard
  (twice the mount's --timeout plus twice its I/O timeout plus 5 s, 15 s under ASan: the kernel
  may retry a failed read once, and a try that began just before the deadline may wait one I/O
  timeout);
- the daemon's RSS (VmRSS, sampled every 0.25 s) stays within --cache-size + RSS_SLACK (more
  under ASan: ASAN_RSS_SLACK);
- after the load, the daemon's threads and non-socket descriptors return to what they were
  after a warm-up pass, and its sockets to at most that plus the pools' bound (which may hold
  more idle connections than during the warm-up); FUSE workers (one /dev/fuse descriptor each,
  kept once started) are not compared with the warm-up, whose concurrency varies, but bounded
  by --threads;
- the test cannot pass vacuously: Redis stays down longer than --timeout, so some reads fail
  (EIO); reads succeeded after the restart; the proxy counted resets, truncations, stalls and
  refusal windows.

With a disk tier (`test_soak_with_a_disk_tier`: `--disk-cache` smaller than the dataset, so it
evicts and takes over the files it evicts), the tier's files are also damaged while the readers
read (TierFaults: a byte flipped, a file cut short, a file removed), and the tier must catch every
one: zero wrong bytes still, and its counters show damage found, files taken over, hits, and
bytes on disk within --disk-cache-size.

DSFS_SOAK_SECONDS (default 20) is the load time per setting; bench/soak.py runs the same soak for
longer and plots it.
"""
import collections
import errno
import hashlib
import json
import os
import random
import subprocess
import threading
import time
import unittest

from harness import DSFS, DsfsTestCase, mount_stats

READERS = 64
CACHE_BYTES = 16 << 20
# What the daemon may hold beyond its object cache: the binary, libc, libfuse and the catalogue
# (about 25 MiB after mounting and a warm-up pass), the 16 FUSE threads' 1 MiB request buffers,
# and the chunks (1 MiB here) being fetched for READs in flight, which the cache bound does not
# count until they are cached.
RSS_SLACK = 64 << 20
# Under AddressSanitizer (CI's second stage) the daemon also holds ASan's quarantine of freed
# memory (256 MiB by default), the shadow of its heap and every allocation's redzones: 477 MiB
# was measured with a 16 MiB cache. The constant is then this; a leak still breaks it.
ASAN_RSS_SLACK = 768 << 20


def runs_under_asan(pid):
    """True when process pid carries AddressSanitizer's runtime (GCC links libasan)."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


# The disk tier's variant: smaller than the dataset (about 34 MB), so it evicts. With a tier the
# daemon may also hold its write-behind queue (64 MiB of objects the memory cache may have let
# go: prefetch/disk_tier.h DiskTierOptions::queue_bytes) and the blocks its 16 stagers and the
# FUSE threads read files into, and glibc keeps what 20 more threads freed in its two arenas:
# 129-222 MiB of RSS was measured with a 16 MiB cache, of which malloc_trim(0) gave back about
# 100 MiB (free memory glibc kept, not objects held). In bench/soak.py --disk-cache it levels
# off within two minutes (docs/reliability.md).
DISK_CACHE_BYTES = 24 << 20
TIER_RSS_SLACK = 192 << 20


def rss_bound(result):
    return (CACHE_BYTES + (ASAN_RSS_SLACK if result.get("asan") else RSS_SLACK)
            + (TIER_RSS_SLACK if result.get("tier_faults") is not None else 0))
MOUNT_TIMEOUT_S = 2
IO_TIMEOUT_S = min(max(MOUNT_TIMEOUT_S, 1), 10)  # fs/filesystem.cpp: clamp(timeout, 1s, 10s)
HANG_GUARD_S = 2 * (MOUNT_TIMEOUT_S + IO_TIMEOUT_S) + 5
# Under AddressSanitizer, on two CPUs shared with two busy loops (CI runs two tests at a time), one
# call took 7.7 s of the 8 s the daemon may take, so 5 s of slack is too little there; a hung call
# still fails (readers that never return fail "a reader hung" as well).
ASAN_HANG_GUARD_S = HANG_GUARD_S + 10


def hang_guard(result):
    """The hang guard of a run_soak result: longer under ASan."""
    return ASAN_HANG_GUARD_S if result.get("asan") else HANG_GUARD_S


# Longer than --timeout, so reads in flight during the restart fail (EIO) and the error path is
# exercised too, not only the retries.
REDIS_DOWN_S = MOUNT_TIMEOUT_S + 1.0

# Each kind of fault, often enough that a 20 s soak sees every one many times. Stalls outlast
# the I/O timeout, so the client gives up on the stalled connection (whose late reply must never
# be read as the answer to a later GET).
PROXY_FAULTS = [
    "--reset-probability", "0.003", "--truncate-probability", "0.003",
    "--stall-probability", "0.002", "--stall", "2500ms",
    "--reset-after", str(24 << 20),
    "--refuse-for", "400ms", "--refuse-every", "4s",
]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def synth_dataset(root, seed=11):
    """Random files of varied sizes (empty, small, images-sized, and multi-chunk with 1 MiB
    chunks) under two directories; returns {relative path: (size, sha256)}."""
    rng = random.Random(seed)
    sizes = [0, 1, 4095, 4096, 1 << 20, (1 << 20) + 1, 3 << 20]
    sizes += [rng.randint(2_000, 300_000) for _ in range(140)]
    sizes += [rng.randint(1_100_000, 2_900_000) for _ in range(6)]
    expected = {}
    for i, size in enumerate(sizes):
        rel = os.path.join(f"part{i % 2}", f"f{i:04d}.bin")
        data = rng.randbytes(size)
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        expected[rel] = (size, sha256(data))
    return expected


class FaultyProxy:
    """`dsfs proxy --rtt 1ms` with PROXY_FAULTS (or `faults`) in front of 127.0.0.1:upstream_port,
    its counters in a JSON file every 0.5 s."""

    def __init__(self, workdir, upstream_port, faults=PROXY_FAULTS, seed=1):
        self.port_file = os.path.join(workdir, "soak-proxy.port")
        self.stats_file = os.path.join(workdir, "soak-proxy.json")
        self.log_path = os.path.join(workdir, "soak-proxy.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [DSFS, "proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream_port}",
             "--rtt", "1ms", "--port-file", self.port_file, "--stats", "0.5s",
             "--stats-file", self.stats_file, "--fault-seed", str(seed)] + list(faults),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dsfs proxy did not start: {self.log_text()}")
            time.sleep(0.02)
        with open(self.port_file) as f:
            self.port = int(f.read())
        self.url = f"redis://127.0.0.1:{self.port}"

    def stats(self):
        with open(self.stats_file) as f:
            return json.load(f)

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


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


FUSE_THREADS = 16  # the mount's --threads default (fs/mount.h kDefaultThreads)


def process_sample(pid):
    """{"rss", "threads", "fds", "sockets", "other_fds"} of a live process (other_fds: the
    sorted targets of its descriptors that are not sockets)."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    sockets = sum(1 for t in targets if t.startswith("socket:"))
    fuse_fds = sum(1 for t in targets if t == "/dev/fuse")
    return {"rss": rss, "threads": len(os.listdir(f"/proc/{pid}/task")), "fds": len(targets),
            "sockets": sockets, "fuse_fds": fuse_fds,
            "other_fds": sorted(t for t in targets
                                if not t.startswith("socket:") and t != "/dev/fuse")}


def other_threads(sample):
    """Threads that are not FUSE workers. Each worker has its own /dev/fuse descriptor
    (clone_fd) besides the session's one, and stays once started (idle threads = --threads),
    so how many exist depends on the busiest moment so far, not on a leak."""
    return sample["threads"] - max(sample["fuse_fds"] - 1, 0)


class Readers:
    """READERS threads doing open/fstat/read-to-EOF/close over random files of the mount, each
    checked against `expected`; the page cache of each file is dropped after reading it, so
    every read goes to the daemon. Counters are under self.lock."""

    def __init__(self, mnt, dataset, expected, seed=5):
        self.mnt, self.dataset, self.expected = mnt, dataset, expected
        self.paths = sorted(expected)
        self.seed = seed
        self.lock = threading.Lock()
        self.ok_files = 0
        self.ok_bytes = 0
        self.wrong = []            # (path, what)
        self.errors = collections.Counter()  # errno name -> count
        self.slowest_call_s = 0.0
        self.slowest_call = ""
        self.stop_event = threading.Event()
        self.threads = []

    def _timed(self, what, fn, *args):
        began = time.monotonic()
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - began
            if took > self.slowest_call_s:
                with self.lock:
                    if took > self.slowest_call_s:
                        self.slowest_call_s, self.slowest_call = took, what

    def read_one(self, rel):
        path = os.path.join(self.mnt, self.dataset, rel)
        size, digest = self.expected[rel]
        try:
            fd = self._timed(f"open {rel}", os.open, path, os.O_RDONLY)
            try:
                st = self._timed(f"fstat {rel}", os.fstat, fd)
                if st.st_size != size:
                    with self.lock:
                        self.wrong.append((rel, f"fstat size {st.st_size}, expected {size}"))
                    return
                h = hashlib.sha256()
                got = 0
                while True:
                    chunk = self._timed(f"read {rel}", os.read, fd, 1 << 20)
                    if not chunk:
                        break
                    h.update(chunk)
                    got += len(chunk)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        except OSError as e:
            with self.lock:
                self.errors[errno.errorcode.get(e.errno, str(e.errno))] += 1
            return
        with self.lock:
            if got != size or h.hexdigest() != digest:
                self.wrong.append((rel, f"read {got} bytes, sha256 {h.hexdigest()[:16]}, "
                                        f"expected {size} bytes, {digest[:16]}"))
            else:
                self.ok_files += 1
                self.ok_bytes += got

    def _loop(self, index, pass_once):
        rng = random.Random(self.seed * 1000 + index)
        if pass_once:  # every file once, split between the threads
            for rel in self.paths[index::READERS]:
                self.read_one(rel)
            return
        while not self.stop_event.is_set():
            self.read_one(rng.choice(self.paths))

    def run_pass(self):
        """Every file once, READERS at a time; returns when done."""
        threads = [threading.Thread(target=self._loop, args=(i, True)) for i in range(READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def start(self):
        self.threads = [threading.Thread(target=self._loop, args=(i, False), daemon=True)
                        for i in range(READERS)]
        for t in self.threads:
            t.start()

    def stop(self, limit_s):
        """Stops the readers; False if one is still stuck after limit_s."""
        self.stop_event.set()
        deadline = time.monotonic() + limit_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def snapshot(self):
        with self.lock:
            return {"ok_files": self.ok_files, "ok_bytes": self.ok_bytes,
                    "wrong": len(self.wrong), "errors": sum(self.errors.values())}


class TierFaults:
    """Damages the disk tier's object files under `tier_dir` while the soak reads: every
    `every_s` one file, picked at random, gets one byte flipped (same size), is cut to half its
    size, or is removed, in turn. Files being written (*.tmp) are damaged too: the tier must
    find that out when it reads them. Counts are under self.lock."""

    KINDS = ("flipped", "truncated", "removed")

    def __init__(self, tier_dir, every_s=0.1, seed=3):
        self.tier_dir = tier_dir
        self.objects = os.path.join(tier_dir, "objects")
        self.every_s = every_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.stop_event = threading.Event()
        self.thread = None

    def damage_one(self):
        files = [os.path.join(d, n) for d, _, names in os.walk(self.objects) for n in names]
        if not files:
            return
        path = self.rng.choice(files)
        kind = self.KINDS[sum(self.counts.values()) % len(self.KINDS)]
        try:
            if kind == "removed":
                os.unlink(path)
            else:
                with open(path, "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size == 0:
                        return
                    if kind == "truncated":
                        f.truncate(size // 2)
                    else:
                        at = self.rng.randrange(size)
                        f.seek(at)
                        byte = f.read(1)
                        f.seek(at)
                        f.write(bytes([byte[0] ^ 0xFF]))
        except FileNotFoundError:
            return  # evicted (or taken over and renamed) meanwhile
        with self.lock:
            self.counts[kind] += 1

    def _loop(self):
        while not self.stop_event.wait(self.every_s):
            self.damage_one()

    def start(self):
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        if self.thread:
            self.thread.join()
        with self.lock:
            return dict(self.counts)


def tier_stats(mnt):
    """stats.json's `disk_tier` object of the mount."""
    return mount_stats(mnt)["disk_tier"]


def run_soak(redis, proxy, mnt, dataset, expected, seconds, restarts=1, log=print,
             tier_faults=None):
    """Warm-up pass, then `seconds` of READERS readers with `restarts` Redis restarts (and
    `tier_faults`, a TierFaults, damaging the disk tier meanwhile), sampling the daemon; then
    waits (deadline) for its threads and descriptors to settle. Returns a dict of results and a
    timeline; asserts nothing (the caller does)."""
    pid = mount_daemon_pid(mnt)
    if pid is None:
        raise AssertionError(f"no daemon found for {mnt}")
    readers = Readers(mnt, dataset, expected)
    readers.run_pass()
    # A disk tier's writers may still have files of the warm-up open (NAME.tmp, being written):
    # the level to come back to is without them (waited for, with a deadline).
    before = process_sample(pid)
    deadline = time.monotonic() + 30
    while any(t.endswith(".tmp") for t in before["other_fds"]) and time.monotonic() < deadline:
        time.sleep(0.1)
        before = process_sample(pid)
    log(f"  warm-up pass: {readers.snapshot()}; daemon {before['threads']} threads, "
        f"{before['fds']} fds ({before['sockets']} sockets), RSS {before['rss'] >> 20} MiB")

    timeline = []
    max_rss = before["rss"]
    sampler_stop = threading.Event()

    def sample_loop():
        nonlocal max_rss
        began = time.monotonic()
        while not sampler_stop.wait(0.25):
            try:
                s = process_sample(pid)
            except (OSError, StopIteration):
                continue
            max_rss = max(max_rss, s["rss"])
            point = {"t": round(time.monotonic() - began, 2), "rss": s["rss"],
                     "threads": s["threads"], "fds": s["fds"], "sockets": s["sockets"]}
            point.update(readers.snapshot())
            try:
                point["proxy_faults"] = proxy.stats()["faults"]
            except (OSError, ValueError):
                pass
            timeline.append(point)

    sampler = threading.Thread(target=sample_loop, daemon=True)
    sampler.start()
    readers.start()
    if tier_faults:
        tier_faults.start()
    began = time.monotonic()
    restarts_done = []
    # Redis restarts evenly spaced (one, halfway, by default): each down for REDIS_DOWN_S (a
    # fault of that length, not a wait for a condition), then up again from its append-only file.
    for k in range(1, restarts + 1):
        readers.stop_event.wait(max(0.0, seconds * k / (restarts + 1) - (time.monotonic() - began)))
        restart = {"ok_files_before": readers.snapshot()["ok_files"],
                   "stopped_at_s": round(time.monotonic() - began, 2)}
        redis.stop()
        readers.stop_event.wait(REDIS_DOWN_S)
        redis.start()
        restart["started_at_s"] = round(time.monotonic() - began, 2)
        restarts_done.append(restart)
    readers.stop_event.wait(max(0.0, seconds - (time.monotonic() - began)))
    damage_done = tier_faults.stop() if tier_faults else None
    all_stopped = readers.stop(ASAN_HANG_GUARD_S + 10)
    elapsed = time.monotonic() - began
    sampler_stop.set()
    sampler.join()
    ok_files_end = readers.snapshot()["ok_files"]
    for restart, following in zip(restarts_done, restarts_done[1:] + [None]):
        until = following["ok_files_before"] if following else ok_files_end
        restart["ok_files_after"] = until - restart["ok_files_before"]

    # Settling: idle pool connections and FUSE threads may stay, new descriptors and threads
    # may not. Wait (with a deadline) until threads and non-socket descriptors are back.
    deadline = time.monotonic() + 30
    while True:
        after = process_sample(pid)
        if (other_threads(after) <= other_threads(before)
                and after["other_fds"] == before["other_fds"]) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.1)

    with readers.lock:
        result = {
            "seconds": round(elapsed, 1), "readers": READERS,
            "ok_files": readers.ok_files, "ok_bytes": readers.ok_bytes,
            "wrong": list(readers.wrong), "errors": dict(readers.errors),
            "slowest_call_s": round(readers.slowest_call_s, 3),
            "slowest_call": readers.slowest_call, "readers_all_stopped": all_stopped,
            "max_rss": max_rss, "asan": runs_under_asan(pid),
            "before": before, "after": after, "restarts": restarts_done,
            "proxy": proxy.stats(), "timeline": timeline,
        }
    if tier_faults:
        result["tier_faults"] = damage_done
        result["tier"], result["tier_bytes_on_disk"] = quiet_tier(mnt, tier_faults.tier_dir)
    return result


def quiet_tier(mnt, tier_dir, limit_s=30):
    """The tier's stats and its files' bytes on disk, read while it writes nothing: its
    write-behind queue still drains after the readers stop, and a walk of its directories while
    a write takes over an evicted file (renamed into another directory) can count that file
    twice. Waits (deadline) for the queue to be empty and for the same counters before and after
    the walk; returns the last reading if it never is."""
    moving = ("writes", "evictions", "write_errors", "writes_dropped", "bytes_used", "entries")
    deadline = time.monotonic() + limit_s
    while True:
        before = tier_stats(mnt)
        on_disk = bytes_on_disk(tier_dir)
        after = tier_stats(mnt)
        if (after["queued_bytes"] == 0 and all(before[k] == after[k] for k in moving)) \
                or time.monotonic() > deadline:
            return after, on_disk
        time.sleep(0.1)


def fault_counts(proxy_stats, before=None):
    """The proxy's fault counters, less those in `before` (an earlier proxy_stats)."""
    kinds = ("resets", "truncations", "stalls", "refuse_windows")
    return {k: proxy_stats["faults"][k] - (before["faults"][k] if before else 0) for k in kinds}


def soak_failures(r, faults, files):
    """What a run_soak result `r` (with `faults`, the fault counts of its run, over a dataset of
    `files` files) breaks of the soak's promises; empty when it keeps them all."""
    failures = []
    if r["wrong"]:
        failures.append(f"wrong bytes served: {r['wrong'][:5]}")
    if not r["readers_all_stopped"]:
        failures.append("a reader hung")
    if set(r["errors"]) - {"EIO"}:
        failures.append(f"errors other than EIO: {r['errors']}")
    if r["errors"].get("EIO", 0) == 0:
        failures.append("Redis was down past --timeout, yet no read failed (EIO)")
    if r["slowest_call_s"] > hang_guard(r):
        failures.append(f"{r['slowest_call']} took {r['slowest_call_s']} s > {hang_guard(r)} s")
    if r["max_rss"] > rss_bound(r):
        failures.append(f"RSS {r['max_rss'] >> 20} MiB > {rss_bound(r) >> 20} MiB")
    if other_threads(r["after"]) > other_threads(r["before"]):
        failures.append(f"threads leaked: {r['before']['threads']} -> {r['after']['threads']} "
                        f"({other_threads(r['before'])} -> {other_threads(r['after'])} besides "
                        f"the FUSE workers)")
    # FUSE workers: at most --threads (the default, 16), one /dev/fuse descriptor each.
    if r["after"]["fuse_fds"] > FUSE_THREADS + 1:
        failures.append(f"{r['after']['fuse_fds']} /dev/fuse descriptors, more than "
                        f"{FUSE_THREADS} workers and the session's")
    if r["after"]["other_fds"] != r["before"]["other_fds"]:
        failures.append(f"descriptors leaked: {r['before']['other_fds']} -> "
                        f"{r['after']['other_fds']}")
    # Pools: prefetch --connections (8) plus as many for reads, plus the lease refresher.
    if r["after"]["sockets"] > r["before"]["sockets"] + 17:
        failures.append(f"sockets leaked: {r['before']['sockets']} -> {r['after']['sockets']}")
    # Not vacuous.
    if r["ok_files"] <= files:
        failures.append(f"only {r['ok_files']} files read whole")
    for restart in r["restarts"]:
        if restart["ok_files_after"] == 0:
            failures.append(f"nothing read after the Redis restart at {restart['stopped_at_s']} s")
    for kind, count in faults.items():
        if count == 0:
            failures.append(f"the proxy injected no {kind}")
    if "tier_faults" in r:
        failures += tier_failures(r)
    return failures


def tier_failures(r):
    """What the disk tier's variant breaks beyond soak_failures: damage it did not find, or a
    run that never exercised it (no hits, no file taken over), or bytes past its size."""
    failures = []
    tier, damage = r["tier"], r["tier_faults"]
    for kind in TierFaults.KINDS:
        if damage.get(kind, 0) == 0:
            failures.append(f"no tier file was {kind}")
    # Flipped and truncated files that were read again must have failed their check (the readers'
    # zero wrong bytes says none got through); removed ones are read errors or plain misses.
    if tier["checksum_failures"] == 0:
        failures.append(f"the tier found no damaged file ({damage} damaged)")
    if tier["hits"] == 0:
        failures.append("the tier served no read")
    if tier["files_reused"] == 0:
        failures.append("no write took over a file it evicted (the tier never filled)")
    if tier["bytes_used"] > tier["capacity_bytes"]:
        failures.append(f"the tier counts {tier['bytes_used']} bytes, more than its size "
                        f"{tier['capacity_bytes']}")
    if r["tier_bytes_on_disk"] > tier["capacity_bytes"]:
        failures.append(f"the tier's files take {r['tier_bytes_on_disk']} bytes, more than its "
                        f"size {tier['capacity_bytes']}")
    return failures


def bytes_on_disk(tier_dir):
    """The tier's object files (finished or not), each rounded up to 4 KiB as the tier counts
    them."""
    total = 0
    for d, _, names in os.walk(os.path.join(tier_dir, "objects")):
        for n in names:
            try:
                total += -(-os.stat(os.path.join(d, n)).st_size // 4096) * 4096
            except FileNotFoundError:
                pass
    return total


class SoakFaultsTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        self.seconds = float(os.environ.get("DSFS_SOAK_SECONDS", "20"))
        data = os.path.join(self.tmp, "data")
        self.expected = synth_dataset(data)
        self.dsfs("ingest", data, "--dataset", "soak", "--chunk-size", "1MiB")
        self.proxy = FaultyProxy(self.tmp, self.redis.port)

    def tearDown(self):
        self.proxy.stop()
        super().tearDown()

    def soak(self, verify, disk_cache=False):
        name = ("verify" if verify else "noverify") + ("-tier" if disk_cache else "")
        mnt = os.path.join(self.tmp, name)
        os.makedirs(mnt)
        extra = ["--verify"] if verify else []
        tier_dir = os.path.join(self.tmp, f"{name}-disk-cache") if disk_cache else None
        if tier_dir:
            extra += ["--disk-cache", tier_dir, "--disk-cache-size", str(DISK_CACHE_BYTES)]
        self.dsfs("mount", mnt, "--redis", self.proxy.url, "--cache-size", str(CACHE_BYTES),
                  "--timeout", f"{MOUNT_TIMEOUT_S}s", *extra, redis=False)
        self.mounts.append(mnt)
        faults_before = self.proxy.stats()
        print(f"\nsoak, --verify {'on' if verify else 'off'}"
              f"{', a disk tier damaged meanwhile' if disk_cache else ''}, {self.seconds:g} s, "
              f"{READERS} readers:", flush=True)
        r = run_soak(self.redis, self.proxy, mnt, "soak", self.expected, self.seconds,
                     tier_faults=TierFaults(tier_dir) if tier_dir else None)
        if tier_dir:
            print(f"  tier: damaged {r['tier_faults']}; {r['tier']['checksum_failures']} "
                  f"checksum failures, {r['tier']['read_errors']} read errors, "
                  f"{r['tier']['hits']} hits, {r['tier']['files_reused']} files taken over, "
                  f"{r['tier']['write_errors']} write errors; {r['tier']['bytes_used']} bytes "
                  f"used ({r['tier_bytes_on_disk']} on disk) of {r['tier']['capacity_bytes']}",
                  flush=True)
        faults = fault_counts(r["proxy"], faults_before)
        print(f"  {r['ok_files']} files read whole ({r['ok_bytes'] / 1e6:.0f} MB), "
              f"{len(r['wrong'])} wrong, errors {r['errors']}; slowest call "
              f"{r['slowest_call_s']} s ({r['slowest_call']}); {r['restarts'][0]['ok_files_after']} "
              f"files after the Redis restart; max RSS {r['max_rss'] >> 20} MiB (bound "
              f"{rss_bound(r) >> 20}{', ASan' if r.get('asan') else ''}); threads {r['before']['threads']} -> "
              f"{r['after']['threads']}, fds {r['before']['fds']} -> {r['after']['fds']} "
              f"(sockets {r['before']['sockets']} -> {r['after']['sockets']}); faults {faults}",
              flush=True)

        self.assertEqual(soak_failures(r, faults, len(self.expected)), [])
        self.umount(mnt)
        return r

    def test_the_check_catches_wrong_bytes_that_the_mount_serves(self):
        # The soak's own check, not the mount's: with --verify off, a byte changed in Redis
        # (same length) is served, and the readers must report every such file.
        flip_first_byte = (
            "local n = 0 "
            "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
            "  local b = redis.call('GETRANGE', k, 0, 0) "
            "  if #b == 1 then "
            "    redis.call('SETRANGE', k, 0, string.char((string.byte(b) + 1) % 256)) "
            "    n = n + 1 "
            "  end "
            "end "
            "return n")
        changed = int(self.redis.cli("EVAL", flip_first_byte, "0", "dsfs:soak:*:o:*"))
        non_empty = sum(1 for size, _ in self.expected.values() if size > 0)
        # Chunked files have one key per chunk, each changed.
        self.assertGreaterEqual(changed, non_empty)
        mnt = self.mount("--cache-size", str(CACHE_BYTES))
        readers = Readers(mnt, "soak", self.expected)
        readers.run_pass()
        self.assertEqual(len(readers.wrong), non_empty, readers.wrong[:3])
        self.assertEqual(readers.ok_files, len(self.expected) - non_empty)
        self.assertEqual(dict(readers.errors), {})

    def test_soak_without_verify(self):
        self.soak(verify=False)

    def test_soak_with_verify(self):
        self.soak(verify=True)

    def test_soak_with_a_disk_tier(self):
        self.soak(verify=False, disk_cache=True)


if __name__ == "__main__":
    unittest.main()
