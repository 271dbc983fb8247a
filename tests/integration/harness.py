"""Shared fixtures for integration tests: a real redis-server on a free port, the dsfs binary,
temporary directories and FUSE mounts that are always cleaned up."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

DSFS = os.environ.get("DSFS_BIN") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "dsfs"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server on 127.0.0.1:port with its own data dir. stop()/start() keep
    the port and the data (AOF), so a test can take Redis away and bring it back."""

    def __init__(self, workdir, password=None):
        self.port = free_port()
        self.password = password
        self.dir = os.path.join(workdir, f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None

    @property
    def url(self):
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--appendonly", "yes", "--save", "",
                "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

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
        self.redis.stop()
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
