"""A Redis that stalls or restarts under a mount (issue 11, item 9), end to end: a real
redis-server stopped with SIGSTOP or SIGTERM under a real mount. A read fails with EIO within
--timeout in total (the kernel re-issues a failed READ; that must not double the wait), and
once Redis answers again the first read succeeds."""
import errno
import os
import signal
import time

from harness import DsfsTestCase

TIMEOUT_S = 3


class RecoveryTest(DsfsTestCase):

    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c"))
        self.files = {}
        for i in range(6):
            data = os.urandom(200_000 + i)
            with open(os.path.join(src, "c", f"{i}.bin"), "wb") as f:
                f.write(data)
            self.files[f"c/{i}.bin"] = data
        self.dsfs("ingest", src, "--dataset", "ds")
        self.mnt = self.mount("--timeout", f"{TIMEOUT_S}s", "--prefetch", "off")

    def read(self, rel):
        with open(os.path.join(self.mnt, "ds", rel), "rb") as f:
            return f.read()

    def timed_failing_read(self, rel):
        started = time.monotonic()
        with self.assertRaises(OSError) as ctx:
            self.read(rel)
        self.assertEqual(ctx.exception.errno, errno.EIO)
        return time.monotonic() - started

    def test_a_read_of_a_stalled_redis_fails_within_the_timeout(self):
        self.assertEqual(self.read("c/0.bin"), self.files["c/0.bin"])
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        try:
            took = self.timed_failing_read("c/1.bin")
            # At least the timeout (it was waited for), at most the timeout plus a margin for
            # the connect and a loaded machine: not twice the timeout (6 s), as the kernel's
            # re-issued READ used to make it.
            self.assertGreaterEqual(took, TIMEOUT_S * 0.9)
            self.assertLess(took, TIMEOUT_S + 2.5, f"one read(2) took {took:.1f} s")
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.assertEqual(self.read("c/5.bin"), self.files["c/5.bin"])  # the first read after
        # The file that just failed, read again at once: Redis answers a probe, so it is tried.
        self.assertEqual(self.read("c/1.bin"), self.files["c/1.bin"])

    def test_the_first_read_after_redis_returns_succeeds(self):
        self.assertEqual(self.read("c/0.bin"), self.files["c/0.bin"])
        self.redis.stop()
        self.timed_failing_read("c/2.bin")
        self.timed_failing_read("c/3.bin")  # marked down: fails at once
        self.redis.start()  # same port and data; returns once it answers PING
        self.assertEqual(self.read("c/4.bin"), self.files["c/4.bin"])
        # A file whose read failed a moment ago, read again at once (perhaps inside the fetcher's
        # re-issue window): a fresh connection's PING is answered, so it is tried, not failed.
        self.assertEqual(self.read("c/2.bin"), self.files["c/2.bin"])
