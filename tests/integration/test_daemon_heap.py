"""The mount daemon's malloc heap (issue 17). The daemon runs with the environment the user gave:
it no longer runs itself again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, whose heap on huge
pages read first epochs 1.06-2.3x slower (docs/benchmarks.md, "The daemon's heap on huge pages:
taken back"); a user's own glibc.malloc.hugetlb still reaches glibc, and the daemon's children
inherit the user's environment. Checked on the real daemon: its exec-time environment
(/proc/PID/environ), its heap mappings (VmFlags `hg` in /proc/PID/smaps) and the environment its
child redis-server got. Memory given back when reads pause: MemoryTrimTest."""
import os

from harness import DSFS, DsfsTestCase, run, wait_for

THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_madvise_mode():
    try:
        with open(THP_MODE_FILE) as f:
            return "[madvise]" in f.read()
    except OSError:
        return False


def exec_environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def huge_page_advised_mappings(pid):
    """How many of the process's mappings carry VmFlags `hg` (MADV_HUGEPAGE)."""
    count = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line.startswith("VmFlags:") and "hg" in line.split()[1:]:
                count += 1
    return count


def uses_glibc_malloc(pid):
    """False for a daemon built with a sanitizer (ASan brings its own allocator, which glibc's
    tunable does not reach): its heap is not glibc's to advise."""
    with open(f"/proc/{pid}/maps") as f:
        return not any("libasan" in line or "libtsan" in line for line in f)


def redis_server_pid(home):
    found = run(["pgrep", "-f", f"redis-server unixsocket:{home}/"], check=False).stdout.split()
    if not found:
        raise AssertionError(f"no embedded redis-server runs for {home}")
    return int(found[0])


class DaemonHeapTest(DsfsTestCase):
    """Each test mounts the embedded server's dataset with the server stopped, so that the mount
    starts redis-server itself: that child shows the environment the daemon passes on."""

    FILES = 24

    def setUp(self):
        super().setUp()
        self.home = self.env["DSFS_HOME"]
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c"))
        # Large enough to come from the heap's big chunks (and be pre-faulted), several MiB in all.
        for i in range(self.FILES):
            with open(os.path.join(src, "c", f"{i:02d}.bin"), "wb") as f:
                f.write(bytes([i]) * (300 * 1024 + i))
        self.dsfs("ingest", src, "--dataset", "ds", redis=False)
        self.dsfs("server", "stop", redis=False)

    def tearDown(self):
        # Before the base class removes DSFS_HOME, or the server could not be told to stop.
        for mnt in list(self.mounts):
            run([DSFS, "umount", mnt], env=self.env, check=False)
        run([DSFS, "server", "stop"], env=self.env, check=False)
        super().tearDown()

    def mount_with(self, tunables):
        env = dict(self.env)
        if tunables is not None:
            env["GLIBC_TUNABLES"] = tunables
        mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(mnt)
        run([DSFS, "mount", mnt, "--cache-size", "64MiB"], env=env)
        self.mounts.append(mnt)
        for i in range(self.FILES):
            with open(os.path.join(mnt, "ds", "c", f"{i:02d}.bin"), "rb") as f:
                self.assertEqual(f.read(), bytes([i]) * (300 * 1024 + i))
        pid = int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])
        return pid, exec_environment(pid), exec_environment(redis_server_pid(self.home))

    def test_the_daemon_keeps_the_users_environment_and_its_heap_is_not_on_huge_pages(self):
        pid, daemon_env, child_env = self.mount_with(None)
        # No second exec with a tunable added (the daemon once did, when THP was in madvise mode).
        self.assertNotIn("GLIBC_TUNABLES", daemon_env)
        self.assertNotIn("DSFS_USER_GLIBC_TUNABLES", daemon_env)
        if thp_madvise_mode() and uses_glibc_malloc(pid):
            self.assertEqual(huge_page_advised_mappings(pid), 0,
                             "the daemon's heap is advised for huge pages though nobody asked")
        self.assertNotIn("GLIBC_TUNABLES", child_env)
        self.assertNotIn("DSFS_USER_GLIBC_TUNABLES", child_env)

    def test_a_users_own_hugetlb_tunable_reaches_glibc(self):
        user_value = "glibc.malloc.hugetlb=1"
        pid, daemon_env, child_env = self.mount_with(user_value)
        self.assertEqual(daemon_env.get("GLIBC_TUNABLES"), user_value)
        self.assertNotIn("DSFS_USER_GLIBC_TUNABLES", daemon_env)
        if thp_madvise_mode() and uses_glibc_malloc(pid):
            self.assertGreater(huge_page_advised_mappings(pid), 0,
                               "the user asked for a heap on huge pages and glibc did not advise")
        self.assertEqual(child_env.get("GLIBC_TUNABLES"), user_value)


class MemoryTrimTest(DsfsTestCase):
    """Once reads pause (2 s), the daemon gives the memory it freed back to the system
    (malloc_trim): objects evicted from a cache smaller than the data leave freed holes in the
    heap that glibc would otherwise keep."""

    FILES = 48
    SIZE = 1024 * 1024

    def test_memory_freed_by_an_epoch_is_given_back_once_reads_pause(self):
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c"))
        for i in range(self.FILES):
            with open(os.path.join(src, "c", f"{i:02d}.bin"), "wb") as f:
                f.write(bytes([i]) * (self.SIZE + i))
        self.dsfs("ingest", src, "--dataset", "ds")
        mnt = self.mount("--cache-size", "16MiB")
        self.assertEqual(self.stats(mnt)["memory"]["trims"], 0, "trimmed before any read")
        # Three times the cache's size: two thirds of the objects are evicted and freed.
        for i in range(self.FILES):
            with open(os.path.join(mnt, "ds", "c", f"{i:02d}.bin"), "rb") as f:
                self.assertEqual(f.read(), bytes([i]) * (self.SIZE + i))
        wait_for(lambda: self.stats(mnt)["memory"]["trims"] >= 1, timeout=30,
                 what="a trim after the reads paused")
        memory = self.stats(mnt)["memory"]
        self.assertGreater(memory["rss_bytes"], 0)
        pid = int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])
        if uses_glibc_malloc(pid):
            self.assertGreater(memory["released_bytes"], 0,
                               f"the trim gave nothing back: {memory}")

    def test_buffers_of_evicted_objects_are_reused_and_given_back_once_reads_pause(self):
        """The buffers of objects the cache lets go are kept (up to a sixteenth of the cache) for
        the next objects of about their size, then freed when reads pause; the bytes every read
        returns stay the file's own."""
        files, size = 64, 200 * 1024
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c"))
        for i in range(files):
            with open(os.path.join(src, "c", f"{i:02d}.bin"), "wb") as f:
                f.write(bytes([i]) * (size + i))
        self.dsfs("ingest", src, "--dataset", "ds")
        mnt = self.mount("--cache-size", "4MiB")  # holds 20 of the 64; keeps one freed buffer
        reuse = self.stats(mnt)["memory"]["buffer_reuse"]
        self.assertEqual(reuse["limit_bytes"], 4 * 1024 * 1024 // 16)
        self.assertEqual(reuse["reused"], 0)
        for order in (range(files), reversed(range(files))):
            for i in order:
                with open(os.path.join(mnt, "ds", "c", f"{i:02d}.bin"), "rb") as f:
                    self.assertEqual(f.read(), bytes([i]) * (size + i), f"file {i}")
        reuse = self.stats(mnt)["memory"]["buffer_reuse"]
        self.assertGreater(reuse["reused"], 0, f"no evicted object's buffer was reused: {reuse}")
        self.assertLessEqual(reuse["held_bytes"], reuse["limit_bytes"])
        wait_for(lambda: self.stats(mnt)["memory"]["trims"] >= 1, timeout=30,
                 what="a trim after the reads paused")
        self.assertEqual(self.stats(mnt)["memory"]["buffer_reuse"]["held_bytes"], 0,
                         "the buffers kept for reuse were not freed when the reads paused")
