"""No secret in argv, logs or `ps` (issue 11, item 3), end to end: a real redis-server with a
password, the real dsfs binary and a real mount daemon. A password given in the --redis URL is
scrubbed from the process's arguments (/proc/PID/cmdline, what `ps` shows every local user);
--redis-password-file and $DSFS_REDIS_PASSWORD / $REDISCLI_AUTH keep it out of argv altogether;
the daemon's log file is readable by its owner only and never holds the password."""
import os
import stat

from harness import DSFS, DsfsTestCase, run

PASSWORD = "s3cr3t-Pa55w0rd"


class SecretsTest(DsfsTestCase):
    redis_password = PASSWORD

    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, "src")
        os.makedirs(os.path.join(src, "c"))
        with open(os.path.join(src, "c", "a.bin"), "wb") as f:
            f.write(b"payload")
        self.dsfs("ingest", src, "--dataset", "ds")  # self.redis.url carries the password
        self.plain_url = f"redis://127.0.0.1:{self.redis.port}"

    def daemon_pid(self, mnt):
        return int(run(["pgrep", "-f", f"dsfs mount {mnt}"]).stdout.split()[0])

    def cmdline(self, pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")

    def test_a_log_file_named_without_a_directory_is_made_in_the_working_directory(self):
        """`--log-file m.log` failed the mount with "cannot create directories: Invalid argument
        []" (its parent path is empty) (audit A)."""
        mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(mnt)
        res = run([DSFS, "mount", mnt, "--redis", self.redis.url, "--log-file", "m.log"],
                  env=self.env, cwd=self.tmp)
        self.mounts.append(mnt)
        log = os.path.join(self.tmp, "m.log")
        self.assertIn(log, res.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(log).st_mode), 0o600)
        with open(os.path.join(mnt, "ds", "c", "a.bin"), "rb") as f:
            self.assertEqual(f.read(), b"payload")

    def test_a_password_in_the_url_is_scrubbed_from_the_daemons_argv_and_log(self):
        mnt = os.path.join(self.tmp, "mnt")
        log = os.path.join(self.tmp, "mount.log")
        os.makedirs(mnt)
        self.dsfs("mount", mnt, "--log-file", log, "--log-level", "debug")
        self.mounts.append(mnt)
        with open(os.path.join(mnt, "ds", "c", "a.bin"), "rb") as f:
            self.assertEqual(f.read(), b"payload")
        args = self.cmdline(self.daemon_pid(mnt))
        self.assertNotIn(PASSWORD, args)
        self.assertIn("redis://:" + "*" * len(PASSWORD) + "@127.0.0.1", args)
        self.assertEqual(stat.S_IMODE(os.stat(log).st_mode), 0o600)
        with open(log, errors="replace") as f:
            self.assertNotIn(PASSWORD, f.read())

    def test_password_file_and_environment_keep_it_out_of_argv(self):
        secret_file = os.path.join(self.tmp, "redis-password")
        with open(secret_file, "w") as f:
            f.write(PASSWORD + "\n")
        os.chmod(secret_file, 0o600)
        listing = run([DSFS, "list", "--redis", self.plain_url, "--redis-password-file",
                       secret_file], env=self.env)
        self.assertIn("ds", listing.stdout)
        for name in ("DSFS_REDIS_PASSWORD", "REDISCLI_AUTH"):
            with self.subTest(variable=name):
                env = dict(self.env, **{name: PASSWORD})
                self.assertIn("ds", run([DSFS, "list", "--redis", self.plain_url],
                                        env=env).stdout)
        # Without a password from anywhere: NOAUTH, named, and the password never printed.
        res = run([DSFS, "list", "--redis", self.plain_url], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertNotIn(PASSWORD, res.stderr)
        res = run([DSFS, "list", "--redis", self.plain_url, "--redis-password-file",
                   os.path.join(self.tmp, "missing")], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--redis-password-file", res.stderr)

    def test_an_acl_user_in_the_url_takes_its_password_from_the_file(self):
        # docs/deploy.md: the user stays in the URL (redis://USER@HOST:PORT), the password in
        # the file or environment. Found by an audit: 'USER@' was refused ("missing ':'").
        self.redis.cli("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "+@all")
        secret_file = os.path.join(self.tmp, "reader-password")
        with open(secret_file, "w") as f:
            f.write("reader-pw\n")
        os.chmod(secret_file, 0o600)
        url = f"redis://reader@127.0.0.1:{self.redis.port}"
        listing = run([DSFS, "list", "--redis", url, "--redis-password-file", secret_file],
                      env=self.env)
        self.assertIn("ds", listing.stdout)
        env = dict(self.env, DSFS_REDIS_PASSWORD="reader-pw")
        self.assertIn("ds", run([DSFS, "list", "--redis", url], env=env).stdout)
        # The user's password, not the default user's: a wrong one is refused.
        env = dict(self.env, DSFS_REDIS_PASSWORD=PASSWORD)
        res = run([DSFS, "list", "--redis", url], env=env, check=False)
        self.assertNotEqual(res.returncode, 0)
        # Without a password from outside, 'USER@' may be a password missing its ':': refused,
        # saying how to name a user, and not echoed.
        res = run([DSFS, "list", "--redis", url], env=self.env, check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("USER@", res.stderr)
        self.assertNotIn("reader@", res.stderr)
