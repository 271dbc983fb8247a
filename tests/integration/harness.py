"""Shared fixtures for integration tests: a real redis-server on a free port, the dsfs binary,
temporary directories and FUSE mounts that are always cleaned up."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

DSFS = os.environ.get("DSFS_BIN") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "dsfs"))
# `dsfs synth` where it only makes a test's data: the ASan stage points this at the release
# build's binary (scripts/test), since an ASan build at -O0 takes 140 s for 1,000 images that
# the release one makes in 7 s. Synth itself is tested by its unit tests, and under every build
# by the tests that still call DSFS for it (test_foundation, test_torchvision, ...).
SYNTH = os.environ.get("DSFS_SYNTH_BIN") or DSFS


def free_port():
    """A loopback port nothing listens on right now (another process may take it before the
    caller binds it: RedisServer.start retries with a fresh one when that happens)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server on 127.0.0.1:port with its own data dir. stop()/start() keep
    the port and the data (AOF), so a test can take Redis away and bring it back. Ready means
    it answered PING; a server that died is noticed (start() says why, check_alive() after)."""

    START_ATTEMPTS = 5
    READY_SECONDS = 10

    def __init__(self, workdir, password=None):
        self.workdir = workdir
        self.password = password
        self.port = None
        self.proc = None

    @property
    def url(self):
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    @property
    def log_path(self):
        return os.path.join(self.dir, "redis.log")

    def log_tail(self, lines=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no redis.log)"

    def start(self):
        """Starts redis-server, on a fresh port the first time (retrying with another when the
        port was taken in the meantime) and on the same port and data after stop()."""
        keep_port = self.port is not None
        for _ in range(1 if keep_port else self.START_ATTEMPTS):
            if not keep_port:
                self.port = free_port()
                self.dir = os.path.join(self.workdir, f"redis-{self.port}")
                os.makedirs(self.dir, exist_ok=True)
            args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                    "--dir", self.dir, "--appendonly", "yes", "--save", "",
                    "--daemonize", "no", "--logfile", self.log_path]
            if self.password:
                args += ["--requirepass", self.password]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + self.READY_SECONDS
            while self.proc.poll() is None and time.monotonic() < deadline:
                if self.ping():
                    return self
                time.sleep(0.05)
            if self.proc.poll() is None:  # alive but not answering: give up on it
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING "
                                   f"within {self.READY_SECONDS} s:\n{self.log_tail()}")
            log = self.log_tail()
            self.proc = None
            if "Address already in use" not in log or keep_port:
                raise RuntimeError(f"redis-server on port {self.port} exited at start:\n{log}")
        raise RuntimeError(f"redis-server found no free port in {self.START_ATTEMPTS} tries")

    def ping(self):
        """True when the server answers PING (after AUTH when it has a password)."""
        request = b"*1\r\n$4\r\nPING\r\n"
        if self.password:
            word = self.password.encode()
            request = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(word), word) + request
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(request)
                reply = b""
                while b"PONG" not in reply and not reply.startswith(b"-"):
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    reply += chunk
                return b"+PONG" in reply
        except OSError:
            return False

    def check_alive(self):
        """Raises, with the end of its log, if the server died while it should be running."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"redis-server on port {self.port} died during the test "
                                 f"(exit {self.proc.returncode}):\n{self.log_tail()}")

    def cli(self, *args):
        cmd = ["redis-cli", "-p", str(self.port)]
        if self.password:
            cmd += ["-a", self.password, "--no-auth-warning"]
        return subprocess.run(cmd + list(args), check=True, capture_output=True,
                              text=True).stdout

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


def run(args, check=True, env=None, timeout=600, **kw):
    """Runs a command, returning CompletedProcess with text output; on failure with check,
    raises with both output streams in the message."""
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"command failed ({res.returncode}): {' '.join(map(str, args))}\n"
                             f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    return res


def synth_data(dest, *args):
    """`dsfs synth DEST ARGS...` with SYNTH: test data, the same bytes from any build."""
    run([SYNTH, "synth", dest, *[str(a) for a in args]])


def wait_for(condition, timeout, what):
    """Polls condition() until it is true; fails naming `what` after `timeout` seconds. The way
    tests synchronize: on a condition with a deadline, never on a sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _status_mask(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    return 0


def signal_handled(pid, signum):
    """True once process pid has a handler installed for signum (SigCgt)."""
    return bool(_status_mask(pid, "SigCgt") & (1 << (signum - 1)))


def signal_delivered(pid, signum):
    """True once signum sent to pid is no longer pending (its handler has run)."""
    bit = 1 << (signum - 1)
    return not (_status_mask(pid, "SigPnd") & bit or _status_mask(pid, "ShdPnd") & bit)


def chars_read(pid):
    """Bytes process pid has read through read(2) and the like (/proc/PID/io rchar)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def mount_stats(mnt):
    """MOUNT/.dsfs/stats.json as a dict. One open and one unbuffered read, so that reading it
    sends the same FUSE requests each time (no isatty() ioctl, no second read)."""
    with open(os.path.join(mnt, ".dsfs", "stats.json"), "rb", buffering=0) as f:
        return json.loads(f.read())


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class Proxy:
    """`dsfs proxy` adding `rtt` (e.g. "20ms") in front of a RedisServer; stop() ends it."""

    def __init__(self, workdir, redis, rtt):
        port_file = os.path.join(workdir, f"proxy-{redis.port}-{rtt}.port")
        self.proc = subprocess.Popen(
            [DSFS, "proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{redis.port}",
             "--rtt", rtt, "--port-file", port_file],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        port = ""
        while not port:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    port = f.read().strip()
            if not port and (self.proc.poll() is not None or time.time() > deadline):
                self.stop()
                raise RuntimeError(f"dsfs proxy did not start: {self.proc.stderr.read()!r}")
            time.sleep(0.02)
        self.port = int(port)
        auth = f":{redis.password}@" if redis.password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc.stderr.close()


class DsfsTestCase(unittest.TestCase):
    """Per-test temp dir, a Redis server (self.redis) and helpers to call dsfs and mount."""

    redis_password = None

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsfs-it-")
        self.env = dict(os.environ, DSFS_HOME=os.path.join(self.tmp, "home"))
        self.env.pop("DSFS_REDIS", None)
        self.redis = RedisServer(self.tmp, password=self.redis_password).start()
        self.mounts = []

    def tearDown(self):
        for mnt in reversed(self.mounts):
            if is_mounted(mnt):
                subprocess.run([DSFS, "umount", mnt], capture_output=True)
            if is_mounted(mnt):
                subprocess.run(["umount", "-l", mnt], capture_output=True)
        try:
            self.redis.check_alive()
        finally:
            self.redis.stop()
            # An embedded server or local cluster a test started under its DSFS_HOME (a command
            # run without --redis) would outlive the test and its deleted directory.
            home = self.env["DSFS_HOME"]
            if any(os.path.isdir(os.path.join(home, d)) for d in ("redis", "cluster")):
                subprocess.run([DSFS, "server", "stop"], env=self.env, capture_output=True,
                               timeout=120)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def dsfs(self, *args, check=True, redis=True, **kw):
        cmd = [DSFS] + [str(a) for a in args]
        if redis:
            cmd += ["--redis", self.redis.url]
        return run(cmd, check=check, env=self.env, **kw)

    def mount(self, *extra, name="mnt"):
        mnt = os.path.join(self.tmp, name)
        os.makedirs(mnt, exist_ok=True)
        self.dsfs("mount", mnt, *extra)
        self.mounts.append(mnt)
        self.assertTrue(is_mounted(mnt), f"{mnt} not mounted after `dsfs mount` returned")
        return mnt

    def stats(self, mnt):
        return mount_stats(mnt)

    def umount(self, mnt):
        self.dsfs("umount", mnt, redis=False)
        self.assertFalse(is_mounted(mnt))
        self.mounts.remove(mnt)


# How close a view tensor must be to torchvision's, in 1/255 pixel steps before normalization.
VIEW_MAX_DIFF = 2
VIEW_MAX_MEAN_DIFF = 0.05


def report_view_diffs(test, title, diffs):
    """Prints each image's (max, mean) difference from torchvision and the worst, then asserts
    every image is within VIEW_MAX_DIFF and VIEW_MAX_MEAN_DIFF."""
    print(f"\n{title}", flush=True)
    for name, (maximum, mean) in sorted(diffs.items()):
        print(f"  {name:32s} max {maximum:.3f}/255  mean {mean:.5f}/255")
    worst = max(m for m, _ in diffs.values())
    worst_mean = max(m for _, m in diffs.values())
    print(f"  overall: max {worst:.3f}/255, largest per-image mean {worst_mean:.5f}/255",
          flush=True)
    for name, (maximum, mean) in diffs.items():
        test.assertLessEqual(maximum, VIEW_MAX_DIFF, name)
        test.assertLessEqual(mean, VIEW_MAX_MEAN_DIFF, name)
