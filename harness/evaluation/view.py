"""The file system a candidate sees: a root of its own that holds only what a Python program needs.

Hiding files by listing them cannot work: a copy of a problem's data anywhere else on the machine
(another checkout, a shared data folder, a cache) stays readable. So each fork server builds, once
and before it forks a candidate, a fresh root on an empty tmpfs and moves into it (`pivot_root`).
It holds, each read-only and at the path it has on the host:

- the system's programs and shared libraries: /usr/bin, /usr/sbin, /usr/lib, /usr/lib32,
  /usr/lib64, /usr/libx32 and /bin, /sbin, /lib, /lib32, /lib64, /libx32 (on a merged-/usr system
  symlinks into /usr); /usr/share/zoneinfo; /etc/ld.so.cache, the dynamic loader's index, and
  /etc/alternatives, the links through which Debian's /usr/lib reaches its BLAS and LAPACK;
- the interpreter: its executable (and each symlink on the way to it), the virtual environment's
  pyvenv.cfg, every folder on sys.path (the standard library, site-packages) unless it is itself
  private, every package folder an editable install maps (setuptools' finder) outside the private
  paths, and every shared library the fork server has loaded (the folder holding it, when it lies
  in the interpreter's own installation, as libpython does under pyenv or conda);
- /dev/null, /dev/zero, /dev/random, /dev/urandom; /dev/fd and /dev/stdin, stdout, stderr as
  links into /proc; a /proc that shows only the fork server's pid namespace;
- empty /tmp, /var/tmp and /dev/shm, where each candidate mounts its private tmpfs.

A site-packages or dist-packages folder inside what is shown but not on sys.path (the base
interpreter's, under a virtual environment) is shown empty. Nothing else exists: no /home, /root,
/opt, /srv, /mnt, /media, /var, /run, /sys, no /usr/local, /usr/src, /usr/include or other
/usr/share folder, nothing else of /etc; the folders on the way to what is shown are empty, so
a pyenv interpreter under /root leaves /root holding nothing but the path down to it.

Standard-library Python only: the fork server loads this file by its path.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import glob
import os
import platform
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

SYSTEM = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
    "/usr/share/zoneinfo",  # time zones, for zoneinfo and the C library
    "/etc/ld.so.cache",  # where the loader finds libraries outside its default folders
    "/etc/alternatives",  # links only: /usr/lib's libblas.so.3 and liblapack.so.3 on Debian
)  # fmt: skip
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
DEVICE_LINKS = {
    "/dev/fd": "/proc/self/fd",
    "/dev/stdin": "/proc/self/fd/0",
    "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}
MOUNT_POINTS = {"/proc": 0o555, "/tmp": 0o1777, "/var/tmp": 0o1777, "/dev/shm": 0o1777}
PACKAGE_FOLDERS = ("site-packages", "dist-packages")
STAGE = "/tmp"  # where the new root is built, on the host's path: it exists everywhere

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC = 4096, 16384
MNT_DETACH = 2
# pivot_root has no C library wrapper; its number by architecture
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


@dataclass(frozen=True)
class Plan:
    """What the new root holds."""

    shown: tuple[str, ...]  # real files and folders, none inside another, bound where they lie
    links: tuple[tuple[str, str], ...]  # (path, text): symlinks on the way to what is shown
    emptied: tuple[str, ...]  # package folders inside `shown` that are not on sys.path


def plan(private: Sequence[str]) -> Plan:
    """The root for this interpreter. Nothing inside a `private` path (real paths) is shown but
    the interpreter's own files and sys.path folders (a virtual environment inside a private
    checkout); a private path inside what is shown is for the caller to cover (`in_sight`)."""
    links: dict[str, str] = {}
    wanted = set()
    candidates = [(path, True) for path in _interpreter(private)]
    candidates += [(path, False) for path in (*SYSTEM, *DEVICES, *_libraries())]
    for path, own in candidates:
        chain: dict[str, str] = {}
        real = _resolve(os.path.abspath(path), chain)
        if real is None or (not own and _inside_any(real, private)):
            continue
        # never a folder holding a mount point of the new root (/, /tmp, /dev, ...)
        if not any(_within(point, real) for point in MOUNT_POINTS):
            wanted.add(real)
            links.update(chain)
    shown = _outermost(wanted)
    on_path = {os.path.realpath(entry) for entry in sys.path if entry}
    emptied = {
        folder
        for top in shown
        for folder in _package_folders(top)
        if folder not in on_path and not any(_within(entry, folder) for entry in on_path)
    }
    # a link inside what is shown is there already
    kept = sorted((path, text) for path, text in links.items() if not _inside_any(path, shown))
    return Plan(tuple(shown), tuple(kept), tuple(sorted(emptied)))


def in_sight(plan: Plan, paths: Iterable[str]) -> list[str]:
    """Those of `paths` (real paths) that lie in what `plan` shows."""
    return [path for path in paths if _inside_any(path, plan.shown)]


def enter(plan: Plan, fresh_proc: bool, warnings: list[str]) -> None:
    """Build the root `plan` describes and move this process's mount namespace into it.

    `fresh_proc`: mount a /proc of this pid namespace (else the host's is shown). Raises OSError
    where the OS refuses, having changed nothing."""
    handles: dict[str, int] = {}  # opened first: the tmpfs at STAGE hides what lies under it
    try:
        for path in plan.shown:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        _mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
        try:
            _populate(plan, handles, fresh_proc, warnings)
            os.chdir(STAGE)
            _move_root(warnings)
        except BaseException:
            os.chdir("/")
            _umount(STAGE)
            raise
    finally:
        for handle in handles.values():
            os.close(handle)
    os.chdir("/")


def _populate(plan: Plan, handles: dict[str, int], fresh_proc: bool, warnings: list[str]) -> None:
    for path in plan.shown:
        target = STAGE + path
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if stat.S_ISDIR(os.fstat(handles[path]).st_mode):
            os.mkdir(target, 0o755)
        else:  # a file, a device: the mount point is an empty file
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        _mount(f"/proc/self/fd/{handles[path]}", target, None, MS_BIND | MS_REC)
    for path, text in (*plan.links, *DEVICE_LINKS.items()):
        os.makedirs(os.path.dirname(STAGE + path), mode=0o755, exist_ok=True)
        os.symlink(text, STAGE + path)
    for path, mode in MOUNT_POINTS.items():
        os.makedirs(STAGE + path, mode=0o755, exist_ok=True)
        os.chmod(STAGE + path, mode)  # whatever the umask
    for folder in plan.emptied:
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount("tmpfs", STAGE + folder, "tmpfs", flags, "size=4k,mode=755")
    if fresh_proc:
        try:  # while the host's /proc is still in this namespace, as a user namespace requires
            _mount("proc", STAGE + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            return
        except OSError as exc:
            warnings.append(f"host processes visible in /proc: {exc.strerror}")
    _mount("/proc", STAGE + "/proc", None, MS_BIND | MS_REC)


def _move_root(warnings: list[str]) -> None:
    """Make the current folder the root of this mount namespace and drop the old root."""
    number = _PIVOT_ROOT.get(platform.machine())
    try:
        if number is None:
            raise OSError(errno.ENOSYS, f"no pivot_root number known for {platform.machine()}")
        _check(_libc().syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    except OSError as exc:
        # the old root stays mounted, out of reach: a process without capabilities (every
        # candidate) cannot leave a chroot
        os.chroot(".")
        warnings.append(f"the candidate's root is a chroot: {exc.strerror or exc}")
        return
    # the old root now lies on top of the new one, at "."
    _check(_libc().umount2(b".", MNT_DETACH), "detaching the old root")


# ---------------------------------------------------------------------------------------------
# What to show.


def _interpreter(private: Sequence[str]) -> Iterator[str]:
    """The interpreter's executable, its virtual environment's configuration and the folders on
    sys.path, but one that is itself private (a checkout an old-style editable install adds)."""
    yield sys.executable
    yield os.path.join(sys.prefix, "pyvenv.cfg")
    yield from (entry for entry in sys.path if entry and os.path.realpath(entry) not in private)


def _libraries() -> Iterator[str]:
    """Packages an editable install maps and shared libraries this process has loaded."""
    yield from _editable_packages()
    yield from _loaded_libraries()


def _editable_packages() -> Iterator[str]:
    """Package folders an editable install's finder maps (setuptools writes a module named
    `__editable___<project>_finder` holding MAPPING, name -> folder)."""
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            yield from (folder for folder in mapping.values() if isinstance(folder, str))


def _loaded_libraries() -> Iterator[str]:
    """Every file mapped into this process (the interpreter, libpython, numpy's libraries...):
    the folder holding it when that lies in the interpreter's own installation, whose other
    libraries its packages may load later; the file alone elsewhere."""
    prefix = os.path.realpath(sys.base_prefix)
    own = prefix not in ("/", "/usr", "/usr/local")  # those hold far more than Python
    with open("/proc/self/maps") as maps:
        files = {line.split(maxsplit=5)[5].rstrip("\n") for line in maps if " /" in line}
    for path in sorted(files):
        real = os.path.realpath(path)
        if not os.path.isfile(real):  # memfds, deleted files
            continue
        yield os.path.dirname(real) if own and real.startswith(prefix + "/") else path


def _resolve(path: str, links: dict[str, str]) -> str | None:
    """The real path of `path`, or None if it does not exist; each symlink on the way goes into
    `links`, so the same path resolves the same way in the new root."""
    parts = path.split("/")[::-1]
    current, hops = "/", 0
    while parts:
        name = parts.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        try:
            info = os.lstat(step)
        except OSError:
            return None
        if not stat.S_ISLNK(info.st_mode):
            current = step
            continue
        hops += 1
        if hops > 40:  # a loop
            return None
        text = os.readlink(step)
        links[step] = text
        if text.startswith("/"):
            current = "/"
        parts.extend(text.split("/")[::-1])
    return current


def _package_folders(top: str) -> Iterator[str]:
    if os.path.isdir(top):
        for name in PACKAGE_FOLDERS:
            yield from glob.glob(os.path.join(glob.escape(top), name))
            yield from glob.glob(os.path.join(glob.escape(top), "python*", name))


def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(paths, key=lambda path: path.split("/")):  # a folder, then what it holds
        if not kept or not _within(path, kept[-1]):
            kept.append(path)
    return kept


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _inside_any(path: str, folders: Iterable[str]) -> bool:
    return any(_within(path, folder) for folder in folders)


# ---------------------------------------------------------------------------------------------
# System calls.


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what} failed: {os.strerror(number)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encoded = [None if text is None else text.encode() for text in (source, target, fstype)]
    _check(_libc().mount(*encoded, flags, data.encode() or None), f"mount {target}")


def _umount(target: str) -> None:
    _libc().umount2(target.encode(), MNT_DETACH)
