"""Mounting the way admins do: `mount -t fuse.dsfs SOURCE DIR -o OPTIONS` and fstab lines, which
mount(8) hands to fuse3's mount.fuse3, which runs `dsfs SOURCE DIR -o OPTIONS`.

mount(8) clears PATH for its helpers, so for type fuse.dsfs mount.fuse3 finds `dsfs` only on
/bin/sh's default path (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin). Without
installing the binary under test there, these tests run (1) mount.fuse3 exactly as mount(8) runs
it for fuse.dsfs, with a PATH whose first directory holds `dsfs` -> $DSFS_BIN, and (2) mount(8)
itself with type `fuse` and SOURCE `/path/to/dsfs#SOURCE`, for which mount.fuse3 runs that
binary with the same argv. Either way the result is a fuse.dsfs mount, unmounted by umount(8).
"""
import os
import shutil
import stat
import subprocess
import tempfile

from harness import DSFS, DsfsTestCase, is_mounted, run, wait_for

SOURCE = None  # module-wide synth tree


def setUpModule():
    global SOURCE
    SOURCE = os.path.join(tempfile.mkdtemp(prefix="dsfs-src-"), "src")
    run([DSFS, "synth", SOURCE, "--classes", "2", "--per-class", "4", "--seed", "3"])


def tearDownModule():
    shutil.rmtree(os.path.dirname(SOURCE), ignore_errors=True)


def mount_fuse3():
    for path in ("/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"):
        if os.path.exists(path):
            return path
    raise AssertionError("mount.fuse3 is missing: install Debian's fuse3 package")


def mountinfo(mnt):
    """(mount options, fs type, source, super options) of the mount at mnt, or None."""
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mnt:
                rest = fields[fields.index("-") + 1:]
                return fields[5], rest[0], rest[1], rest[2]
    return None


def daemon_pids(mnt):
    """Processes of the dsfs binary whose arguments name mnt (the mount daemon)."""
    binary = os.path.realpath(DSFS)
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") != binary:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if mnt in args:
            pids.append(int(pid))
    return pids


def datasets(mnt):
    return sorted(name for name in os.listdir(mnt) if not name.startswith("."))


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class MountHelperTest(DsfsTestCase):
    redis_password = "s3cret-pw"

    def setUp(self):
        super().setUp()
        self.dsfs("ingest", SOURCE, "--dataset", "mh")
        self.dsfs("ingest", SOURCE, "--dataset", "other")
        # mount.fuse3 runs `dsfs` through /bin/sh and PATH: a directory holding only that name.
        self.bindir = os.path.join(self.tmp, "bin")
        os.makedirs(self.bindir)
        os.symlink(os.path.realpath(DSFS), os.path.join(self.bindir, "dsfs"))
        self.helper_env = dict(self.env, PATH=self.bindir + os.pathsep + os.environ["PATH"])
        self.plain_url = f"redis://127.0.0.1:{self.redis.port}"
        self.password_file = os.path.join(self.tmp, "redis.pass")
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.redis_password + "\n")

    def tearDown(self):
        for mnt in self.mounts:
            if is_mounted(mnt):
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        super().tearDown()

    def new_mountpoint(self, name):
        mnt = os.path.join(self.tmp, name)
        os.makedirs(mnt)
        self.mounts.append(mnt)
        return mnt

    def helper_mount(self, source, mnt, options, check=True):
        """mount.fuse3 as mount(8) runs it for `mount -t fuse.dsfs SOURCE MNT -o OPTIONS`."""
        return run([mount_fuse3(), source, mnt, "-o", options, "-t", "fuse.dsfs"],
                   check=check, env=self.helper_env, timeout=120)

    def assert_serves_source(self, mnt):
        compared = 0
        for root, _, files in os.walk(SOURCE):
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as want, \
                        open(os.path.join(mnt, "mh", os.path.relpath(path, SOURCE)), "rb") as got:
                    self.assertEqual(got.read(), want.read(), path)
                compared += 1
        self.assertEqual(compared, 8)

    def assert_umount_ends_daemon(self, mnt, pids):
        run(["umount", mnt])
        self.assertFalse(is_mounted(mnt))
        for pid in pids:
            wait_for(lambda: gone(pid), 20, f"the dsfs daemon {pid} to exit after umount")

    def test_mount_fuse3_for_type_fuse_dsfs(self):
        mnt = self.new_mountpoint("mnt")
        # The options mount(8) hands over for `defaults,_netdev,nofail,x-systemd.automount,...`
        # (it keeps _netdev and nofail for mount.fuse3 to strip; dsfs drops x-* itself).
        self.helper_mount(self.plain_url, mnt,
                          f"rw,noatime,nodev,dataset=mh,cache_size=64M,prefetch=off,allow_other,"
                          f"redis_password_file={self.password_file},_netdev,nofail,"
                          f"x-systemd.automount")
        info = mountinfo(mnt)
        self.assertIsNotNone(info, f"{mnt} is not mounted")
        options, fstype, source, super_options = info
        self.assertEqual(fstype, "fuse.dsfs")
        self.assertEqual(source, "dsfs")
        self.assertIn("noatime", options.split(","))
        self.assertIn("nodev", options.split(","))
        self.assertIn("allow_other", super_options.split(","))
        listing = run(["mount"]).stdout
        self.assertIn(f"on {mnt} type fuse.dsfs", listing)
        self.assertEqual(datasets(mnt), ["mh"])  # dataset=mh: only that one
        self.assert_serves_source(mnt)
        pids = daemon_pids(mnt)
        self.assertEqual(len(pids), 1, "expected one dsfs daemon for the mount")
        self.assert_umount_ends_daemon(mnt, pids)

    def test_password_in_source_is_scrubbed(self):
        mnt = self.new_mountpoint("mnt")
        self.helper_mount(self.redis.url, mnt, "cache_size=64M")
        self.assertEqual(datasets(mnt), ["mh", "other"])  # a URL SOURCE: every dataset
        pids = daemon_pids(mnt)
        self.assertEqual(len(pids), 1)
        with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
            cmdline = f.read()
        self.assertNotIn(self.redis_password.encode(), cmdline)
        self.assertIn(f"redis://:{'*' * len(self.redis_password)}@".encode(), cmdline)
        self.assert_serves_source(mnt)
        self.assert_umount_ends_daemon(mnt, pids)
        # In -o redis=URL, between other options, as well.
        self.helper_mount("mh", mnt, f"rw,redis={self.redis.url},cache_size=64M,allow_other")
        pids = daemon_pids(mnt)
        self.assertEqual(len(pids), 1)
        with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
            cmdline = f.read()
        self.assertNotIn(self.redis_password.encode(), cmdline)
        self.assertIn(b",cache_size=64M,allow_other", cmdline)
        self.assertEqual(datasets(mnt), ["mh"])
        self.assert_umount_ends_daemon(mnt, pids)

    def test_mount8_with_dataset_source(self):
        # mount(8) itself; type fuse with PROGRAM#SOURCE runs the binary under test by its path.
        mnt = self.new_mountpoint("mnt")
        run(["mount", "-t", "fuse", f"{os.path.realpath(DSFS)}#mh", mnt, "-o",
             f"redis={self.plain_url},redis_password_file={self.password_file},"
             f"cache_size=64M,defaults,_netdev,ro"], env=self.env, timeout=120)
        options, fstype, _, _ = mountinfo(mnt)
        self.assertEqual(fstype, "fuse.dsfs")
        self.assertIn("ro", options.split(","))
        self.assertEqual(datasets(mnt), ["mh"])
        self.assert_serves_source(mnt)
        self.assert_umount_ends_daemon(mnt, daemon_pids(mnt))

    def test_bad_options_fail_naming_them(self):
        mnt = self.new_mountpoint("mnt")
        res = self.helper_mount(self.plain_url, mnt, "dataset=mh,bogus_option=1", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("unknown mount option 'bogus_option=1'", res.stderr)
        res = self.helper_mount(self.plain_url, mnt, "cache_size", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("mount option 'cache_size' needs a value", res.stderr)
        # A value dsfs mount refuses: its own message, naming the option.
        res = self.helper_mount(self.plain_url, mnt, "prefetch=sometimes", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--prefetch", res.stderr)
        # Through mount(8) as well: its exit status and dsfs's message come through.
        res = run(["mount", "-t", "fuse", f"{os.path.realpath(DSFS)}#{self.plain_url}", mnt,
                   "-o", "nonsense"], check=False, env=self.env, timeout=120)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("unknown mount option 'nonsense'", res.stderr)
        # A password file other users can read is refused.
        os.chmod(self.password_file, 0o644)
        res = self.helper_mount(self.plain_url, mnt,
                                f"dataset=mh,redis_password_file={self.password_file}",
                                check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn(f"chmod 600 {self.password_file}", res.stderr)
        self.assertFalse(is_mounted(mnt))
        self.assertEqual(stat.S_IMODE(os.stat(self.password_file).st_mode), 0o644)
