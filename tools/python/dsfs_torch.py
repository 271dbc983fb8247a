"""Prefetch hints for PyTorch loaders that read a dsfs mount.

A dsfs mount predicts the order of the coming reads; a loader that knows it can say so exactly by
writing the paths to MOUNT/.dsfs/plan. PlanSampler does that for any sampler: each epoch it draws
the whole order first, writes the matching files to the plan in one write, then hands the
indices to the DataLoader. It runs in the main process (where the DataLoader draws indices), so
it works with any num_workers. The mount keeps a plan per writing process, so DDP ranks sharing
one mount (PlanSampler over a DistributedSampler in each) are each fetched for at their own
position.

    from torch.utils.data import DataLoader
    from torchvision import datasets
    from dsfs_torch import PlanSampler

    dataset = datasets.ImageFolder("/mnt/dsfs/imagenet-train", transform=...)
    sampler = PlanSampler(dataset)          # RandomSampler(dataset), plan written every epoch
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)            # forwarded to a DistributedSampler, if wrapped
        for images, labels in loader:
            ...

read_file and pil_loader read a file the cheapest way for any FUSE filesystem: Python before
3.14 asks isatty() of every file opened with default buffering, an ioctl that Linux sends to the
filesystem's daemon each time, so on a warm mount it is the only round trip left per file (and
halves a plain `open(p, "rb").read()` loop). They open unbuffered instead:

    dataset = datasets.ImageFolder("/mnt/dsfs/imagenet-train", loader=dsfs_torch.pil_loader)

Pure Python and torch; nothing here needs the dsfs binary.
"""
import errno
import os

from torch.utils.data import RandomSampler, Sampler

__all__ = ["PlanSampler", "write_plan", "find_mount", "is_dsfs_mount", "NotADsfsMount",
           "read_file", "pil_loader", "PLAN_FILE", "STATS_FILE"]

PLAN_FILE = os.path.join(".dsfs", "plan")
STATS_FILE = os.path.join(".dsfs", "stats.json")


def read_file(path):
    """The whole file as bytes, as `open(path, "rb").read()` but without its isatty() ioctl."""
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def pil_loader(path):
    """torchvision's default image loader (RGB PIL image) reading through read_file."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(read_file(path))) as image:
        return image.convert("RGB")


class NotADsfsMount(ValueError):
    """The directory given (or found from a dataset) is not the root of a dsfs mount."""


def is_dsfs_mount(path):
    """True if `path` is the root of a dsfs mount (it holds .dsfs/stats.json)."""
    return os.path.isfile(os.path.join(path, STATS_FILE))


def find_mount(path):
    """The root of the dsfs mount holding `path` (a dataset root, a file, the mount itself):
    the nearest directory at or above it with .dsfs/stats.json. Raises NotADsfsMount."""
    start = os.path.abspath(os.fspath(path))
    for candidate in (start, os.path.realpath(start)):
        directory = candidate if os.path.isdir(candidate) else os.path.dirname(candidate)
        while True:
            if is_dsfs_mount(directory):
                return directory
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
    raise NotADsfsMount(f"{path} is not inside a dsfs mount (no directory above it holds "
                        f"{STATS_FILE}); pass mount= the directory `dsfs mount` mounted")


def _check_mount(mount):
    if not is_dsfs_mount(mount):
        raise NotADsfsMount(f"{mount} is not a dsfs mount (it has no {STATS_FILE}); give the "
                            f"directory `dsfs mount` mounted")


class _Relativizer:
    """Turns paths into the mount-relative form the plan holds, as `dsfs plan` does."""

    def __init__(self, mount):
        self.mount = mount
        self.roots = []
        for root in (os.path.abspath(mount), os.path.realpath(mount)):
            root = os.path.normpath(root)
            if root not in self.roots:
                self.roots.append(root)

    def __call__(self, path):
        text = os.fspath(path)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if not text:
            raise ValueError("an empty path cannot be planned")
        if "\n" in text or "\r" in text or "\0" in text:
            raise ValueError(f"{text!r}: a path with a newline, CR or NUL cannot be planned")
        if os.path.isabs(text):
            normal = os.path.normpath(text)
            for root in self.roots:
                if normal.startswith(root + os.sep) or (root == os.sep and normal != root):
                    return os.path.relpath(normal, root)
            raise ValueError(f"{text} is not under the dsfs mount {self.mount}; give paths inside "
                             f"it (absolute, or relative to it)")
        normal = os.path.normpath(text)
        if normal == "." or normal == ".." or normal.startswith(".." + os.sep):
            raise ValueError(f"{text} is not a file under the dsfs mount {self.mount}")
        return normal


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_plan(mount, paths, append=False):
    """Writes `paths` (absolute paths inside `mount`, or paths relative to it) to
    MOUNT/.dsfs/plan in one write, replacing the plan, or extending it with append=True.
    Returns how many paths were written. Raises NotADsfsMount, ValueError for a path outside the
    mount, OSError if the plan cannot be written (PermissionError: only the user who mounted it
    may write the plan)."""
    mount = os.fspath(mount)
    _check_mount(mount)
    relative = _Relativizer(mount)
    return _write_lines(mount, [relative(p) for p in paths], append)


def _write_lines(mount, lines, append):
    """Writes mount-relative `lines` to the plan in one write(2) (repeated only if the kernel
    takes less)."""
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
    plan = os.path.join(mount, PLAN_FILE)
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(plan, flags)
    except FileNotFoundError as e:
        raise OSError(e.errno, f"{plan} does not exist: this mount's dsfs predates the prefetch "
                               f"engine (remount it with a newer dsfs)") from e
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        raise OSError(e.errno, f"{plan} cannot be written: the mount was made read-only (-o ro), "
                               f"which takes no plan; remount it without -o ro") from e
    try:
        if data:
            _write_all(fd, data)
        elif not append:
            # No write to replace the old plan with; O_TRUNC alone may not reach the mount.
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return len(lines)


def _flatten(items):
    """Sample indices from what a sampler yields: indices, or batches (lists) of them."""
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        elif hasattr(item, "tolist"):  # a tensor or numpy value
            value = item.tolist()
            if isinstance(value, list):
                yield from _flatten(value)
            else:
                yield value
        else:
            yield item


class PlanSampler(Sampler):
    """Wraps a sampler (default: RandomSampler(dataset)) so that each epoch's order is written
    to the mount's plan before the DataLoader reads any of it.

    sampler_or_dataset: a torch Sampler (its data_source or dataset attribute is the dataset, if
        any), or a dataset, sampled by RandomSampler(dataset).
    mount: root of the dsfs mount; None finds it above the dataset's root (dataset.root, else
        the first sample's path).
    paths: where sample i lives: None takes dataset.samples[i][0] or dataset.imgs[i][0]
        (torchvision ImageFolder/DatasetFolder; filesystem paths), a sequence gives paths[i], a
        callable paths(i); these two give absolute paths inside the mount or paths relative to
        the mount's root.
    append: extend the plan each epoch instead of replacing it.

    Each iteration draws the wrapped sampler's whole order (so it is held in memory), writes it,
    then yields it unchanged; batches (a wrapped BatchSampler) are planned sample by sample and
    yielded as they came. The mount-relative path of each sample is worked out once, on the
    first epoch, unless paths is a callable.
    """

    def __init__(self, sampler_or_dataset, mount=None, paths=None, append=False):
        if isinstance(sampler_or_dataset, Sampler):
            self.sampler = sampler_or_dataset
            self.dataset = getattr(sampler_or_dataset, "data_source", None)
            if self.dataset is None:
                self.dataset = getattr(sampler_or_dataset, "dataset", None)
        else:
            self.dataset = sampler_or_dataset
            self.sampler = RandomSampler(sampler_or_dataset)
        self.append = append
        self.epoch = 0
        self._path_of, self._path_count = self._path_lookup(paths)
        if mount is None:
            mount = find_mount(self._anchor())
        else:
            mount = os.fspath(mount)
            _check_mount(mount)
        self.mount = mount
        self._relative = _Relativizer(mount)
        self._lines = None  # every sample's plan line, when the paths are a fixed list

    def _path_lookup(self, paths):
        """(index -> path, how many paths there are, or None for a callable)."""
        if paths is None:
            for attribute in ("samples", "imgs"):
                samples = getattr(self.dataset, attribute, None)
                if samples is not None:
                    # Filesystem paths: a relative one is relative to the working directory.
                    return (lambda i: os.path.abspath(samples[i][0])), len(samples)
            raise TypeError(
                "PlanSampler cannot tell which file each sample is: the dataset has no .samples "
                "or .imgs (as torchvision's ImageFolder has); pass paths= a list of paths or a "
                "function index -> path")
        if callable(paths):
            return paths, None
        return paths.__getitem__, len(paths)

    def _anchor(self):
        """A path inside the mount, to find it from."""
        root = getattr(self.dataset, "root", None)
        if root:
            return root
        if self._path_count == 0:
            raise NotADsfsMount("PlanSampler has no path to find the dsfs mount from (an empty "
                                "dataset without .root); pass mount=")
        return self._path_of(0)

    def plan_lines(self, indices):
        """The plan's lines (mount-relative paths) for these sample indices, in order."""
        if self._path_count is None:
            return [self._relative(self._path_of(i)) for i in indices]
        if self._lines is None:
            self._lines = [self._relative(self._path_of(i)) for i in range(self._path_count)]
        lines = self._lines
        return [lines[i] for i in indices]

    def __iter__(self):
        order = list(iter(self.sampler))
        _write_lines(self.mount, self.plan_lines(_flatten(order)), self.append)
        return iter(order)

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        """Remembers the epoch and forwards it to the wrapped sampler if it takes one
        (DistributedSampler reshuffles by it)."""
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
