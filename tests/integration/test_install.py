"""Install and package (issue 15): `cmake --install` of the build DSFS_BIN lives in, into a
staging prefix, gives a dsfs that runs, its man pages, the docs and an importable dsfs_torch, and
nothing else (no test binaries); `cpack -G DEB` makes a .deb holding the same files that depends
on the libraries dsfs links (dpkg-shlibdeps) and on the programs it runs (fuse3's fusermount3,
redis-server). Nothing is installed on this machine: the .deb is only read with dpkg-deb."""
import gzip
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import DSFS

BUILD = os.path.dirname(os.path.abspath(DSFS))


def cache_value(name):
    """NAME's value in BUILD/CMakeCache.txt, or None."""
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        for line in f:
            match = re.match(rf"{re.escape(name)}:[A-Z]+=(.*)$", line.rstrip("\n"))
            if match:
                return match.group(1)
    return None


def python_dir():
    """Where dsfs_torch.py goes, relative to the prefix (DSFS_INSTALL_PYTHONDIR)."""
    return cache_value("DSFS_INSTALL_PYTHONDIR")


def run(args, **kw):
    """Runs args, failing the test with its output when it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


class InstallCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("cmake", "cpack", "dpkg-deb"):
            if not shutil.which(tool):
                raise unittest.SkipTest(f"{tool} is not installed")
        if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
            raise AssertionError(f"DSFS_BIN={DSFS} is not in a CMake build directory")
        cls.tmp = tempfile.mkdtemp(prefix="dsfs-install-")
        cls.prefix = os.path.join(cls.tmp, "staging")
        run(["cmake", "--install", BUILD, "--prefix", cls.prefix])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def staged(self, *parts):
        return os.path.join(self.prefix, *parts)

    def test_installed_binary_runs(self):
        dsfs = self.staged("bin", "dsfs")
        self.assertTrue(os.access(dsfs, os.X_OK), f"{dsfs} is not an executable")
        self.assertEqual(run([dsfs, "--version"]), run([DSFS, "--version"]))
        self.assertRegex(run([dsfs, "--version"]), r"^dsfs \d+\.\d+\.\d+\n$")
        self.assertIn("Usage: dsfs", run([dsfs, "--help"]))
        self.assertIn("Usage: dsfs mount", run([dsfs, "mount", "--help"]))

    def test_man_pages(self):
        self.assertNotIn("NOTFOUND", cache_value("DSFS_HELP2MAN") or "NOTFOUND",
                         "help2man was not found when BUILD was configured (scripts/install-deps "
                         "installs it)")
        man1 = self.staged("share", "man", "man1")
        # One page per subcommand that `dsfs --help` lists, besides dsfs.1.
        help_text = run([DSFS, "--help"]).split("\nSubcommands:\n", 1)[1]
        subcommands = re.findall(r"^  ([a-z][a-z0-9-]*)", help_text, re.MULTILINE)
        self.assertIn("mount", subcommands)
        expected = {"dsfs.1.gz"} | {f"dsfs-{sub}.1.gz" for sub in subcommands}
        self.assertEqual(set(os.listdir(man1)), expected)
        for page in sorted(expected):
            with gzip.open(os.path.join(man1, page), "rt") as f:
                roff = f.read()
            name = page[:-len(".1.gz")]
            lines = [line for line in roff.splitlines() if not line.startswith('.\\"')]
            self.assertTrue(lines[0].startswith(f'.TH {name.upper()} "1"'), f"{page}: {lines[0]}")
            self.assertRegex(roff, rf"\n\.SH NAME\n{re.escape(name)} \\- \S", page)
            self.assertIn("\n.SH SYNOPSIS\n", roff, page)
        # The options of `dsfs mount --help` are in its page (roff escapes each -).
        mount_options = re.findall(r"^  (?:-\w,)?(--[a-z-]+)", run([DSFS, "mount", "--help"]),
                                   re.MULTILINE)
        self.assertGreater(len(mount_options), 5)
        with gzip.open(os.path.join(man1, "dsfs-mount.1.gz"), "rt") as f:
            roff = f.read()
        for option in mount_options:
            self.assertIn(option.replace("-", "\\-"), roff)
        if shutil.which("man"):  # man-db renders it without complaint
            env = dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80", LC_ALL="C")
            proc = subprocess.run(["man", "-l", os.path.join(man1, "dsfs-mount.1.gz")],
                                  capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("dsfs-mount - mount published datasets", proc.stdout)
            self.assertNotIn("warning", proc.stderr)

    def test_dsfs_torch_imports_from_the_python_dir(self):
        pythondir = self.staged(python_dir())
        self.assertTrue(os.path.isfile(os.path.join(pythondir, "dsfs_torch.py")))
        # Run from the temp dir, so that only PYTHONPATH can find it (not tools/python).
        out = run(["/usr/bin/python3", "-c",
                   "import dsfs_torch; print(dsfs_torch.__file__); "
                   "print(callable(dsfs_torch.PlanSampler), callable(dsfs_torch.write_plan))"],
                  cwd=self.tmp, env=dict(os.environ, PYTHONPATH=pythondir,
                                         PYTHONDONTWRITEBYTECODE="1"))
        path, exposed = out.splitlines()
        self.assertEqual(os.path.dirname(path), pythondir)
        self.assertEqual(exposed, "True True")

    def test_docs(self):
        docdir = self.staged("share", "doc", "dsfs")
        self.assertTrue(os.path.isfile(os.path.join(docdir, "README.md")))
        source = cache_value("CMAKE_HOME_DIRECTORY")  # the tree BUILD was configured from
        source_docs = {f for f in os.listdir(os.path.join(source, "docs")) if f.endswith(".md")}
        self.assertIn("cli.md", source_docs)
        self.assertEqual(set(os.listdir(os.path.join(docdir, "docs"))), source_docs)

    def test_nothing_else_is_installed(self):
        allowed = ("bin/dsfs", "share/man/man1/", "share/doc/dsfs/",
                   python_dir() + "/dsfs_torch.py")
        for root, _, files in os.walk(self.prefix):
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), self.prefix)
                self.assertTrue(rel.startswith(allowed), f"installed, but not asked for: {rel}")

    def test_deb(self):
        out = os.path.join(self.tmp, "deb")
        cpack = ["cpack", "-G", "DEB", "-B", out,
                 "--config", os.path.join(BUILD, "CPackConfig.cmake")]
        # dpkg-shlibdeps takes a minute over an ASan build's 160 MB binary (its relocations): there
        # the package declares only fuse3 and redis-server; the release build checks the libraries.
        sanitized = (cache_value("DSFS_SANITIZE") or "").upper() in ("ON", "1", "TRUE", "YES", "Y")
        if sanitized:
            cpack += ["-D", "CPACK_DEBIAN_PACKAGE_SHLIBDEPS=OFF"]
        run(cpack, cwd=BUILD)
        debs = [f for f in os.listdir(out) if f.endswith(".deb")]
        self.assertEqual(len(debs), 1, os.listdir(out))
        deb = os.path.join(out, debs[0])
        self.assertTrue(debs[0].startswith("dsfs_"), debs[0])

        self.assertEqual(run(["dpkg-deb", "-f", deb, "Package"]).strip(), "dsfs")
        depends = run(["dpkg-deb", "-f", deb, "Depends"]).strip()
        names = [re.match(r"\s*([a-z0-9][a-z0-9.+-]*)", alternative).group(1)
                 for dependency in depends.split(",") for alternative in dependency.split("|")]
        libraries = () if sanitized else ("libfuse3", "libhiredis", "libc6")
        for wanted in ("fuse3", "redis-server") + libraries:
            self.assertTrue(any(n.startswith(wanted) for n in names), f"{wanted}: {depends}")
        # Every package it depends on is a real one: this machine, which built dsfs, has each
        # installed, or one that provides it (libspdlog1.10 provides libspdlog1.10-fmt9).
        installed = set()
        for line in run(["dpkg-query", "-W", "-f",
                         "${db:Status-Abbrev}|${Package}|${Provides}\n"]).splitlines():
            status, package, provides = line.split("|", 2)
            if status.startswith("ii"):
                installed.add(package)
                installed.update(re.findall(r"([a-z0-9][a-z0-9.+-]*)(?:\s*\([^)]*\))?",
                                            provides))
        for dependency in depends.split(","):
            alternatives = re.findall(r"([a-z0-9][a-z0-9.+-]*)\s*(?:\([^)]*\))?\s*(?:\||$)",
                                      dependency.strip())
            self.assertTrue(alternatives and installed.intersection(alternatives),
                            f"{dependency.strip()}, from Depends: {depends}")

        listing = run(["dpkg-deb", "-c", deb])
        files = {line.split()[-1] for line in listing.splitlines()}
        for wanted in ("./usr/bin/dsfs", "./usr/share/man/man1/dsfs.1.gz",
                       "./usr/share/man/man1/dsfs-mount.1.gz",
                       f"./usr/{python_dir()}/dsfs_torch.py",
                       "./usr/share/doc/dsfs/README.md", "./usr/share/doc/dsfs/docs/cli.md"):
            self.assertIn(wanted, files)
        self.assertFalse([f for f in files if f.endswith("_test")], "test binaries packaged")

        # The packaged binary runs (stripped: CPACK_STRIP_FILES).
        unpacked = os.path.join(self.tmp, "unpacked")
        run(["dpkg-deb", "-x", deb, unpacked])
        self.assertEqual(run([os.path.join(unpacked, "usr", "bin", "dsfs"), "--version"]),
                         run([DSFS, "--version"]))


if __name__ == "__main__":
    unittest.main()
