"""End-to-end: ingest a synthetic ImageFolder tree plus awkward files into a real redis-server,
mount it with FUSE, and check it behaves as an ordinary read-only copy of the source."""
import errno
import json
import os
import shutil
import signal
import tarfile
import tempfile
import time
import unittest

from harness import DSFS, DsfsTestCase, free_port, is_mounted, mount_stats, run, wait_for

SOURCE = None  # module-wide source tree: synth output plus awkward files


def setUpModule():
    global SOURCE
    base = tempfile.mkdtemp(prefix="dsfs-src-")
    SOURCE = os.path.join(base, "src")
    run([DSFS, "synth", SOURCE, "--classes", "3", "--per-class", "8", "--seed", "7"])
    awkward = os.path.join(SOURCE, "class_0001")
    with open(os.path.join(awkward, "name with spaces.JPEG"), "wb") as f:
        f.write(b"\xff\xd8not really a jpeg, but bytes are bytes")
    os.makedirs(os.path.join(SOURCE, "ünïcødé klass", "nested", "deeper"))
    with open(os.path.join(SOURCE, "ünïcødé klass", "nested", "deeper", "файл.txt"), "w") as f:
        f.write("non-JPEG text file in a nested directory\n")
    open(os.path.join(SOURCE, "ünïcødé klass", "empty.bin"), "wb").close()
    os.makedirs(os.path.join(SOURCE, "class_0002", "empty dir"))
    # Larger than the 4 MiB default chunk: stored as several chunk keys.
    with open(os.path.join(SOURCE, "class_0000", "big.bin"), "wb") as f:
        f.write(os.urandom(9 * 1024 * 1024 + 123))
    os.utime(os.path.join(awkward, "name with spaces.JPEG"), (1_500_000_000, 1_500_000_000))


def tearDownModule():
    shutil.rmtree(os.path.dirname(SOURCE), ignore_errors=True)


def files_under(root):
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = path
    return out


def torchvision_classes(root):
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


class IngestMountTest(DsfsTestCase):
    def setUp(self):
        super().setUp()
        self.dsfs("ingest", SOURCE, "--dataset", "imgs")
        self.mnt = self.mount("--timeout", "3s")
        self.ds = os.path.join(self.mnt, "imgs")

    def test_tree_matches_source(self):
        run(["diff", "-r", SOURCE, self.ds])
        src_files = files_under(SOURCE)
        mnt_files = files_under(self.ds)
        self.assertEqual(sorted(src_files), sorted(mnt_files))
        for rel, path in src_files.items():
            s, m = os.stat(path), os.stat(mnt_files[rel])
            self.assertEqual(s.st_size, m.st_size, rel)
            self.assertEqual(int(s.st_mtime), int(m.st_mtime), rel)
        self.assertTrue(os.path.isdir(os.path.join(self.ds, "class_0002", "empty dir")))
        # Nothing extra inside the dataset's own tree.
        self.assertEqual(sorted(os.listdir(self.ds)), sorted(os.listdir(SOURCE)))
        self.assertIn(".meta", os.listdir(self.mnt))
        self.assertIn(".dsfs", os.listdir(self.mnt))

    def test_shell_tools(self):
        src_sums = run(["bash", "-c", "cd '%s' && find . -type f -print0 | sort -z | "
                        "xargs -0 md5sum" % SOURCE]).stdout
        mnt_sums = run(["bash", "-c", "cd '%s' && find . -type f -print0 | sort -z | "
                        "xargs -0 md5sum" % self.ds]).stdout
        self.assertEqual(src_sums, mnt_sums)
        copy = os.path.join(self.tmp, "copy")
        run(["cp", "-r", self.ds, copy])
        run(["diff", "-r", SOURCE, copy])
        tar_path = os.path.join(self.tmp, "t.tar")
        run(["tar", "-C", self.mnt, "-cf", tar_path, "imgs"])
        with tarfile.open(tar_path) as t:
            names = {m.name for m in t.getmembers() if m.isfile()}
        self.assertEqual(names, {"imgs/" + r for r in files_under(SOURCE)})
        # du walks the tree with stat: apparent size = every entry's st_size, files as ingested.
        du = int(run(["du", "-s", "--apparent-size", "-B1", self.ds]).stdout.split()[0])
        entries = [self.ds] + [os.path.join(d, n) for d, dirs, files in os.walk(self.ds)
                               for n in dirs + files]
        self.assertEqual(du, sum(os.lstat(p).st_size for p in entries))
        self.assertEqual(sum(os.path.getsize(p) for p in files_under(self.ds).values()),
                         sum(os.path.getsize(p) for p in files_under(SOURCE).values()))
        blocks = int(run(["du", "-s", "-B1", self.ds]).stdout.split()[0])
        self.assertGreater(blocks, 0)  # st_blocks is filled in, so du without flags works too
        ls = run(["ls", "-la", os.path.join(self.ds, "class_0001")]).stdout
        self.assertIn("name with spaces.JPEG", ls)

    def test_meta_labels_xattrs(self):
        classes = torchvision_classes(SOURCE)
        meta = os.path.join(self.mnt, ".meta", "imgs")
        with open(os.path.join(meta, "classes.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read().splitlines(), classes)
        import csv
        with open(os.path.join(meta, "labels.csv"), encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
        self.assertEqual(rows[0], ["path", "label"])
        labels = {r[0]: r[1] for r in rows[1:]}
        src_files = files_under(SOURCE)
        self.assertEqual(sorted(labels), sorted(src_files))
        for rel in src_files:
            top = rel.split("/")[0]
            expected = str(classes.index(top)) if "/" in rel else ""
            self.assertEqual(labels[rel], expected, rel)
            path = os.path.join(self.ds, rel)
            if expected:
                self.assertEqual(os.getxattr(path, "user.dsfs.label").decode(), expected)
                self.assertEqual(os.getxattr(path, "user.dsfs.class").decode(), top)
                self.assertIn("user.dsfs.label", os.listxattr(path))
        with open(os.path.join(meta, "info.json")) as f:
            info = json.load(f)
        source_bytes = sum(os.path.getsize(p) for p in src_files.values())
        self.assertEqual(info["name"], "imgs")
        self.assertEqual(info["namespace"], "dsfs")
        self.assertEqual(info["files"], len(src_files))
        self.assertEqual(info["bytes"], source_bytes)
        self.assertEqual(info["classes"], len(classes))
        self.assertGreater(info["generation"], 0)
        self.assertEqual(info["source"], os.path.realpath(SOURCE))
        self.assertEqual(info["checksum"], "xxh64")
        stats = mount_stats(self.mnt)
        self.assertEqual(stats["namespace"], "dsfs")
        self.assertEqual(stats["redis"], self.redis.url)
        self.assertEqual(stats["datasets"]["imgs"]["files"], len(src_files))
        self.assertEqual(stats["datasets"]["imgs"]["bytes"], source_bytes)
        self.assertEqual(stats["datasets"]["imgs"]["generation"], info["generation"])
        self.assertEqual(stats["errors"]["missing_objects"], 0)
        self.assertEqual(stats["errors"]["checksum_mismatches"], 0)
        self.assertGreaterEqual(stats["requests_total"], stats["requests"]["lookup"])

    def test_writes_are_refused(self):
        target = os.path.join(self.ds, "class_0000", "big.bin")
        attempts = [
            lambda: open(target, "r+b").write(b"x"),
            lambda: open(os.path.join(self.ds, "new.txt"), "w"),
            lambda: os.mkdir(os.path.join(self.ds, "newdir")),
            lambda: os.rename(target, target + ".moved"),
            lambda: os.unlink(target),
            lambda: os.truncate(target, 0),
            lambda: os.chmod(target, 0o777),
            lambda: os.setxattr(target, "user.x", b"1"),
        ]
        for attempt in attempts:
            with self.assertRaises(OSError) as ctx:
                attempt()
            self.assertEqual(ctx.exception.errno, errno.EROFS, ctx.exception)
        run(["diff", "-r", SOURCE, self.ds])

    def test_redis_outage_gives_eio_then_recovers(self):
        # Without prefetching: reading files[0] would otherwise fetch files[1] ahead, and a file
        # already in the cache is served while Redis is away (test_prefetch covers that).
        self.umount(self.mnt)
        self.mnt = self.mount("--timeout", "3s", "--prefetch", "off")
        self.ds = os.path.join(self.mnt, "imgs")
        files = sorted(files_under(self.ds).values())
        with open(files[0], "rb") as f:
            f.read()
        self.redis.stop()
        start = time.monotonic()
        with self.assertRaises(OSError) as ctx:
            with open(files[1], "rb") as f:
                f.read()
        self.assertEqual(ctx.exception.errno, errno.EIO)
        # --timeout 3s: bounded, not hung (generous margin; this is not a timing assertion
        # about speed, only that the read gave up instead of hanging forever).
        self.assertLess(time.monotonic() - start, 60)
        self.redis.start()
        with open(files[1], "rb") as f:
            data = f.read()
        rel = os.path.relpath(files[1], self.ds)
        with open(os.path.join(SOURCE, rel), "rb") as f:
            self.assertEqual(data, f.read())

    def test_an_unmount_while_redis_is_down_ends_the_daemon(self):
        # With the default --timeout (30 s), a poll of the dataset watcher under way when Redis
        # went away held the daemon's exit for up to 30 s after the unmount: `dsfs umount`
        # reported that the daemon had not exited (found by an audit).
        self.umount(self.mnt)
        mnt = self.mount("--watch-interval", "200ms", name="down")
        self.redis.stop()
        try:
            wait_for(lambda: self.stats(mnt)["watch"]["failures"] >= 1, 60,
                     "the watcher to meet the outage")
            res = self.dsfs("umount", mnt, redis=False, check=False)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.mounts.remove(mnt)
        finally:
            self.redis.start()
        self.assertFalse(is_mounted(mnt))

    def test_reingest_keeps_open_readers_and_snapshot(self):
        big = os.path.join(self.ds, "class_0000", "big.bin")
        with open(os.path.join(SOURCE, "class_0000", "big.bin"), "rb") as f:
            original = f.read()
        changed = os.path.join(self.tmp, "changed")
        shutil.copytree(SOURCE, changed)
        with open(os.path.join(changed, "class_0000", "big.bin"), "wb") as f:
            f.write(b"replaced" * 1000)
        with open(big, "rb") as reader:
            head = reader.read(1 << 20)
            self.dsfs("ingest", changed, "--dataset", "imgs")
            rest = reader.read()
        self.assertEqual(head + rest, original)
        # The mount keeps its snapshot; a new mount sees the new generation.
        run(["diff", "-r", SOURCE, self.ds])
        mnt2 = self.mount(name="mnt2")
        run(["diff", "-r", changed, os.path.join(mnt2, "imgs")])
        self.umount(mnt2)

    def test_two_reingests_keep_the_mounted_generation(self):
        # Nothing is read before the re-ingests, so every byte below comes from Redis, from
        # the generation loaded at mount: with keep-generations 1 alone, the second ingest's
        # GC would delete it and the reads would fail with EIO.
        gen = int(self.redis.cli("HGET", "dsfs:{imgs}:info", "generation").strip())
        leases = self.redis.cli("ZRANGE", "dsfs:{imgs}:readers", "0", "-1").split()
        self.assertEqual(len(leases), 1, leases)
        self.assertTrue(leases[0].startswith(f"{gen}:"), leases)

        def objects_of(generation):
            return self.redis.cli("--scan", "--pattern", f"dsfs:imgs:{generation}:o:*").split()

        def manifests_of(generation):
            return self.redis.cli("--scan", "--pattern",
                                  f"dsfs:{{imgs}}:manifest:{generation}:*").split()

        original_objects = len(objects_of(gen))
        self.assertGreater(original_objects, 0)
        def current():
            return int(self.redis.cli("HGET", "dsfs:{imgs}:info", "generation").strip())

        made = []  # the two re-ingests' generations
        for round_ in (1, 2):
            changed = os.path.join(self.tmp, f"changed{round_}")
            shutil.copytree(SOURCE, changed)
            with open(os.path.join(changed, "class_0000", "big.bin"), "wb") as f:
                f.write(b"round %d " % round_ * 1000)
            jpeg = sorted(files_under(os.path.join(changed, "class_0001")).values())[0]
            with open(jpeg, "ab") as f:
                f.write(b"changed")
            self.dsfs("ingest", changed, "--dataset", "imgs")
            made.append(current())
        self.assertTrue(gen < made[0] < made[1], (gen, made))
        self.assertEqual(len(objects_of(gen)), original_objects)
        run(["diff", "-r", SOURCE, self.ds])

        # Unmounting releases the lease: the next ingest collects the old generation (and the
        # one after it, beyond --keep-generations 1).
        self.umount(self.mnt)
        self.assertEqual(self.redis.cli("EXISTS", "dsfs:{imgs}:readers").strip(), "0")
        self.dsfs("ingest", SOURCE, "--dataset", "imgs")
        for old in (gen, made[0]):
            self.assertEqual(objects_of(old), [], f"generation {old} was not collected")
            self.assertEqual(manifests_of(old), [], f"generation {old} was not collected")
        self.assertGreater(len(objects_of(made[1])), 0)  # the previous one is kept
        self.assertEqual(sorted(self.redis.cli("SMEMBERS", "dsfs:{imgs}:gens").split()),
                         sorted([str(made[1]), str(current())]))

    def lease_expiry_ms(self):
        """The latest expiry (server ms) of any lease on imgs; 0 when there is none."""
        scores = self.redis.cli("ZRANGE", "dsfs:{imgs}:readers", "0", "-1", "WITHSCORES").split()
        return max((float(x) for x in scores[1::2]), default=0)

    def redis_time_ms(self):
        seconds, micros = self.redis.cli("TIME").split()
        return int(seconds) * 1000 + int(micros) // 1000

    def test_killed_mount_pins_only_until_its_lease_expires(self):
        self.umount(self.mnt)
        mnt = self.mount("--lease-ttl", "1s", name="short")
        gen = int(self.redis.cli("HGET", "dsfs:{imgs}:info", "generation").strip())
        scan = ("--scan", "--pattern", f"dsfs:imgs:{gen}:o:*")
        # Outliving its ttl twice over, the lease is kept alive by the daemon's refresher: wait
        # (with a deadline) until Redis holds an expiry renewed past the first one plus 2 ttls.
        first_expiry = self.lease_expiry_ms()
        deadline = time.monotonic() + 30
        while self.lease_expiry_ms() < first_expiry + 2000:
            self.assertLess(time.monotonic(), deadline, "the lease was not refreshed")
            time.sleep(0.05)
        for _ in range(2):
            self.dsfs("ingest", os.path.join(SOURCE, "class_0002"), "--dataset", "imgs")
        self.assertNotEqual(self.redis.cli(*scan).split(), [])
        run(["diff", "-r", SOURCE, os.path.join(mnt, "imgs")])
        # A daemon killed without unmounting stops refreshing: after the ttl, GC may collect.
        pid = int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        # Wait until its lease has expired by the Redis server's clock (what GC goes by).
        deadline = time.monotonic() + 30
        while self.lease_expiry_ms() >= self.redis_time_ms():
            self.assertLess(time.monotonic(), deadline, "the lease never expired")
            time.sleep(0.05)
        self.dsfs("ingest", os.path.join(SOURCE, "class_0001"), "--dataset", "imgs")
        self.assertEqual(self.redis.cli(*scan).split(), [])
        self.assertEqual(self.redis.cli("EXISTS", "dsfs:{imgs}:readers").strip(), "0")

    def test_sigterm_unmounts(self):
        pid = int(run(["pgrep", "-f", f"dsfs mount {self.mnt}"]).stdout.split()[0])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while is_mounted(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse(is_mounted(self.mnt))


class CommandErrorsTest(DsfsTestCase):
    def test_mountpoint_errors(self):
        res = self.dsfs("mount", os.path.join(self.tmp, "missing"), check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("missing", res.stderr)
        # A readahead past 1 GiB is refused (2^64-1 bytes wrapped around to 0 KiB before).
        os.makedirs(os.path.join(self.tmp, "ra"))
        res = self.dsfs("mount", os.path.join(self.tmp, "ra"), "--readahead",
                        "18446744073709551615", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--readahead", res.stderr)
        self.assertFalse(is_mounted(os.path.join(self.tmp, "ra")))
        self.dsfs("ingest", os.path.join(SOURCE, "class_0000"), "--dataset", "one")
        mnt = self.mount()
        res = self.dsfs("mount", mnt, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("mount", res.stderr.lower())

    def test_a_dead_mount_is_named_as_one(self):
        # A mount whose daemon died: stats, refresh and plan say so and how to clear it (they asked
        # "is it a dsfs mount?", or "is the mount still there?", of one that is).
        self.dsfs("ingest", os.path.join(SOURCE, "class_0000"), "--dataset", "one")
        mnt = self.mount()
        pid = int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.listdir(mnt)
            except OSError as e:
                self.assertIn(e.errno, (errno.ENOTCONN, errno.ECONNABORTED))
                break
            self.assertLess(time.monotonic(), deadline, "the mount outlived its daemon")
            time.sleep(0.05)
        for args in (["stats", mnt], ["refresh", mnt], ["plan", mnt, "/dev/null"]):
            res = run([DSFS, *args], check=False, env=self.env)
            self.assertNotEqual(res.returncode, 0, args)
            self.assertIn("daemon has exited", res.stderr, args)
            self.assertIn(f"dsfs umount {mnt}", res.stderr, args)
        run([DSFS, "umount", mnt], env=self.env)
        self.assertFalse(is_mounted(mnt))

    def test_a_redis_that_evicts_any_key_is_refused_for_ingest(self):
        # Found by an audit: into a Redis with maxmemory-policy allkeys-lru, ingest said
        # "ingested" while objects of it and of the dataset before were evicted (EIO on reads).
        self.redis.cli("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        self.redis.cli("CONFIG", "SET", "maxmemory", "1gb")
        res = self.dsfs("ingest", SOURCE, "--dataset", "ev", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("maxmemory-policy allkeys-lru", res.stderr)
        self.assertIn("noeviction", res.stderr)
        self.assertEqual(self.redis.cli("DBSIZE").strip(), "0")
        # Without a maxmemory it cannot evict yet: ingest and mount warn.
        self.redis.cli("CONFIG", "SET", "maxmemory", "0")
        res = self.dsfs("ingest", SOURCE, "--dataset", "ev")
        self.assertIn("allkeys-lru", res.stderr)
        mnt = os.path.join(self.tmp, "evm")
        os.makedirs(mnt)
        self.mounts.append(mnt)
        res = self.dsfs("mount", mnt)
        self.assertIn("allkeys-lru", res.stderr)
        run(["diff", "-r", SOURCE, os.path.join(mnt, "ev")])
        self.redis.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")

    def test_list_names_what_an_ingest_that_never_published_left(self):
        # A first ingest killed before publishing leaves its objects and its name in the set,
        # with no info: list said nothing of it (an audit found 80 MB left so).
        self.dsfs("ingest", SOURCE, "--dataset", "kept")
        self.redis.cli("SADD", "dsfs:datasets", "halfway")
        self.redis.cli("SET", "dsfs:halfway:1:o:1", "x")
        res = self.dsfs("list")
        self.assertIn("kept", res.stdout)
        self.assertNotIn("halfway", res.stdout)
        self.assertIn("not published: 'halfway'", res.stderr)
        self.assertIn("dsfs rm NAME", res.stderr)
        self.dsfs("rm", "halfway")
        self.assertEqual(self.redis.cli("EXISTS", "dsfs:halfway:1:o:1").strip(), "0")
        self.assertNotIn("halfway", self.dsfs("list").stderr)

    def test_unreachable_redis(self):
        os.makedirs(os.path.join(self.tmp, "m"))
        dead_port = free_port()  # nothing listens there
        start = time.monotonic()
        res = run([DSFS, "mount", os.path.join(self.tmp, "m"), "--redis",
                   f"redis://127.0.0.1:{dead_port}"], check=False, env=self.env, timeout=120)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn(str(dead_port), res.stderr)
        self.assertLess(time.monotonic() - start, 60)
        self.assertFalse(is_mounted(os.path.join(self.tmp, "m")))

    def test_bad_ingest_inputs(self):
        for args in (["ingest", SOURCE, "--dataset", "bad name!"],
                     ["ingest", os.path.join(self.tmp, "nope"), "--dataset", "x"],
                     ["info", "nope"], ["rm", "nope"]):
            res = self.dsfs(*args, check=False)
            self.assertNotEqual(res.returncode, 0, args)
            self.assertTrue(res.stderr.strip(), args)
        # A name beginning with '-' is taken for an option by every later command.
        res = self.dsfs("ingest", SOURCE, "--dataset=-dash", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("begins with '-'", res.stderr)
        # An empty --redis (an unset variable) is refused, not taken for no --redis (the
        # embedded server, started in this test's DSFS_HOME).
        res = self.dsfs("ingest", SOURCE, "--dataset", "x", "--redis", "", check=False,
                        redis=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("empty URL", res.stderr)
        # A misspelt command is named (CLI11 said "A subcommand is required"). Followed by a
        # directory it is the mount-helper form, `dsfs SOURCE MOUNTPOINT` (fs/mount_helper.h).
        res = self.dsfs("injest", "--dataset", "x", check=False, redis=False)
        self.assertEqual(res.returncode, 1)
        self.assertIn("unknown command 'injest'", res.stderr)
        self.assertEqual(self.redis.cli("DBSIZE").strip(), "0")

    def test_failed_ingest_keeps_previous_generation(self):
        self.dsfs("ingest", SOURCE, "--dataset", "imgs")
        before = json.loads(self.dsfs("info", "imgs", "--json").stdout)
        broken_tar = os.path.join(self.tmp, "broken.tar")
        run(["tar", "-C", SOURCE, "-cf", broken_tar, "."])
        size = os.path.getsize(broken_tar)
        with open(broken_tar, "r+b") as f:
            f.truncate(size // 2)
        res = self.dsfs("ingest", broken_tar, "--dataset", "imgs", check=False)
        self.assertNotEqual(res.returncode, 0)
        after = json.loads(self.dsfs("info", "imgs", "--json").stdout)
        self.assertEqual(before["generation"], after["generation"])
        mnt = self.mount()
        run(["diff", "-r", SOURCE, os.path.join(mnt, "imgs")])

    def test_tar_list_info_rm(self):
        tar_path = os.path.join(self.tmp, "src.tar")
        run(["tar", "-C", SOURCE, "-cf", tar_path, "."])
        self.dsfs("ingest", tar_path, "--dataset", "fromtar")
        self.assertIn("fromtar", self.dsfs("list").stdout)
        info = json.loads(self.dsfs("info", "fromtar", "--json").stdout)
        self.assertEqual(info["file_count"], len(files_under(SOURCE)))
        mnt = self.mount()
        run(["diff", "-r", SOURCE, os.path.join(mnt, "fromtar")])
        self.umount(mnt)
        self.dsfs("rm", "fromtar")
        self.assertNotIn("fromtar", self.dsfs("list").stdout)
        # Nothing is left but the name's generation counter (a dataset made again under the
        # name must not reuse a generation number).
        self.assertEqual(self.redis.cli("KEYS", "*").split(), ["dsfs:{fromtar}:nextgen"])


class AuthTest(DsfsTestCase):
    redis_password = "s3cret pass"

    def test_password_and_acl_user(self):
        from urllib.parse import quote
        url = f"redis://:{quote(self.redis_password)}@127.0.0.1:{self.redis.port}"
        run([DSFS, "ingest", os.path.join(SOURCE, "class_0002"), "--dataset", "a",
             "--redis", url], env=self.env)
        self.redis.cli("ACL", "SETUSER", "trainer", "on", ">pw2", "~*", "+@all")
        user_url = f"redis://trainer:pw2@127.0.0.1:{self.redis.port}"
        self.assertIn("a", run([DSFS, "list", "--redis", user_url], env=self.env).stdout)
        wrong = f"redis://trainer:wrong@127.0.0.1:{self.redis.port}"
        res = run([DSFS, "list", "--redis", wrong], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertNotIn("wrong", res.stderr)  # the password is never echoed
        env = dict(self.env, DSFS_REDIS=user_url)
        self.assertIn("a", run([DSFS, "list"], env=env).stdout)


    def test_a_user_without_a_permission_is_told_so_not_that_the_dataset_is_damaged(self):
        """A user with reads only: `rm` said the dataset was damaged and to pass --force (which
        skips the check that protects mounts); ingest named the wrong command (audit A)."""
        from urllib.parse import quote
        url = f"redis://:{quote(self.redis_password)}@127.0.0.1:{self.redis.port}"
        run([DSFS, "ingest", os.path.join(SOURCE, "class_0002"), "--dataset", "a",
             "--redis", url], env=self.env)
        self.redis.cli("ACL", "SETUSER", "reader", "on", ">pw3", "~*", "+@read", "+ping")
        reader = f"redis://reader:pw3@127.0.0.1:{self.redis.port}"
        res = run([DSFS, "rm", "a", "--redis", reader], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("NOPERM", res.stderr)
        self.assertIn("ACL users", res.stderr)
        self.assertNotIn("damaged", res.stderr)
        res = run([DSFS, "ingest", os.path.join(SOURCE, "class_0002"), "--dataset", "b",
                   "--redis", reader], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("EVAL", res.stderr)
        self.assertIn("ACL users", res.stderr)
        self.assertIn("a", run([DSFS, "list", "--redis", url], env=self.env).stdout)


class EmbeddedServerTest(DsfsTestCase):
    def tearDown(self):
        run([DSFS, "server", "stop"], env=self.env, check=False)
        super().tearDown()

    def test_embedded_default(self):
        res = run([DSFS, "server", "status"], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        run([DSFS, "server", "start"], env=self.env)
        self.assertEqual(run([DSFS, "server", "status"], env=self.env).returncode, 0)
        run([DSFS, "ingest", os.path.join(SOURCE, "class_0001"), "--dataset", "emb"],
            env=self.env)
        run([DSFS, "server", "stop"], env=self.env)
        # Any command starts it again; the data survived.
        self.assertIn("emb", run([DSFS, "list"], env=self.env).stdout)
        mnt = os.path.join(self.tmp, "m")
        os.makedirs(mnt)
        run([DSFS, "mount", mnt], env=self.env)
        self.mounts.append(mnt)
        run(["diff", "-r", os.path.join(SOURCE, "class_0001"), os.path.join(mnt, "emb")])

    def test_a_server_that_cannot_write_its_data_is_reported_at_once(self):
        """$DSFS_HOME on a full disk: redis-server answers every command, PING too, with
        MISCONF. Commands waited 10 s for it and then called it unreachable on its socket."""
        tiny = os.path.join(self.tmp, "tiny")
        os.makedirs(tiny)
        run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tiny])
        env = dict(self.env, DSFS_HOME=os.path.join(tiny, "h"))
        pid_file = os.path.join(tiny, "h", "redis", "redis.pid")
        try:
            run([DSFS, "server", "start"], env=env)
            with open(os.path.join(tiny, "fill"), "wb") as f:
                f.write(b"\0" * (1000 << 10))
            res = run([DSFS, "ingest", os.path.join(SOURCE, "class_0001"), "--dataset", "full"],
                      env=env, check=False)
            self.assertIn("MISCONF", res.stderr)
            res = run([DSFS, "list"], env=env, check=False, timeout=60)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("answers but refuses commands", res.stderr)
            self.assertIn("free space there", res.stderr)
        finally:
            # It cannot save, so it does not stop by itself: killed.
            with open(pid_file) as f:
                pid = int(f.read().split()[0])
            os.kill(pid, signal.SIGKILL)
            run(["umount", "-l", tiny], check=False)


if __name__ == "__main__":
    unittest.main()
