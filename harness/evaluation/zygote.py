"""The sandbox's fork server: one per worker slot; forks one candidate process per evaluation.

The sandbox starts this file as `python -I zygote.py CONFIG` with a minimal environment.
It imports only the standard library, `view.py` beside it (by its path) and the modules it is
told to preload, so a candidate (a fork of it) inherits nothing of the harness. The sandbox also
imports it for `encode` and `decode`, the one data format both sides speak.

Process tree when the harness runs as root (not root: a user namespace stands in for the uid):

    harness ── launcher ── zygote     pid 1 of its own pid namespace, own network namespace
                (waits)      │        (no interfaces) and mount namespace, whose root holds
                             │        only what Python needs, read-only (view.py)
                             └── candidate   pid 1 of a fresh pid namespace: when it exits the
                                             kernel kills whatever it started; fresh mount, IPC
                                             and UTS namespaces; private /tmp; rlimits;
                                             a uid of its own; no_new_privs

Protocol on the zygote's stdin/stdout: frames of an 8-byte big-endian length and a body. After
start-up the zygote sends a hello (JSON). It answers each request (JSON) with an empty frame at
once, so the harness knows whether a request was taken before a zygote died, and, when the
candidate is done, with a header (JSON: how the candidate ended, output tails, isolation) and a
payload: the raw bytes the candidate wrote, which only the harness decodes, strictly. Nothing
the candidate produces is ever unpickled or executed.

A request with a referee splits the candidate process in two once it is locked down
(`Candidate._refereed`): it forks the referee, trusted code that alone keeps the result pipe and
the call's arguments, then replaces itself (exec) with a fresh interpreter that loads the
candidate's program and answers the referee's calls over two pipes (`serve_calls`).
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import errno
import fcntl
import functools
import gc
import importlib
import importlib.util
import json
import marshal
import math
import os
import re
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterable
from typing import Any, NoReturn

# ---------------------------------------------------------------------------------------------
# Data format: JSON plus two markers. Arrays travel as raw bytes, so they round-trip exactly.

ARRAY = "__ndarray__"  # {"__ndarray__": [dtype.str, shape, base64 of the C-order bytes]}
COMPLEX = "__complex__"  # {"__complex__": [real, imag]}
MAX_DEPTH = 100
MAX_INT_BITS = 13_000  # about 3,900 digits: Python refuses to parse ints longer than 4,300
# Values in one message (an array counts as one). Bounds what decoding costs the trusted process:
# a million small values are ~100 MB of Python objects, where 60 MB of "[]," would be 6 GB.
MAX_VALUES = 1_000_000
MAX_DIMENSION = 1 << 40  # per array axis; any larger is a lie about an array that fits in memory
_NUMERIC_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")  # never object, string or structured
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # not Unicode text: no UTF-8, no database


class CodecError(ValueError):
    """A value that cannot be sent; the message reads after 'returned ' or 'the arguments hold '."""


class TooLarge(CodecError):
    """The encoded value would exceed the size limit."""


def encode(value: Any, max_bytes: int | None = None) -> Any:
    """Turn data (JSON types, tuples, numeric numpy arrays and scalars) into JSON-able values.

    With `max_bytes`, stop early (TooLarge) once the JSON text is sure to be longer: encoding a
    huge array only to reject it could take longer than the candidate's whole time limit.
    """
    return _encode(value, "", 0, [max_bytes if max_bytes is not None else 1 << 62, MAX_VALUES])


def decode(value: Any) -> Any:
    """Inverse of `encode` for parsed JSON; strict, because the bytes may come from a candidate."""
    return _decode(value, "", 0, [MAX_VALUES])


def structure_count(text: bytes) -> int:
    """An upper bound on the values JSON `text` parses into (each value but the first follows a
    comma or opens a container), cheap enough to check before parsing untrusted bytes."""
    return text.count(b",") + text.count(b"[") + text.count(b"{") + 1


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def _is_marker(key: str) -> bool:
    return len(key) > 4 and key.startswith("__") and key.endswith("__")


def _spend(budget: list[int], size: int) -> None:
    budget[0] -= size  # a lower bound on the JSON text this value becomes
    if budget[0] < 0:
        raise TooLarge("a value too large to send")


def _count(budget: list[int]) -> None:
    budget[-1] -= 1
    if budget[-1] < 0:
        raise CodecError(f"more than {MAX_VALUES:,} values")


def _check_text(text: str, where: str) -> None:
    if _LONE_SURROGATE.search(text):
        raise CodecError(f"a string that is not valid Unicode (a lone surrogate){_at(where)}")


def _encode(value: Any, where: str, depth: int, budget: list[int]) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError(f"a value nested deeper than {MAX_DEPTH} levels{_at(where)}")
    kind = type(value)
    _spend(budget, len(value) + 2 if kind is str else 1)
    _count(budget)
    if kind is str:
        _check_text(value, where)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        if value.bit_length() > MAX_INT_BITS:
            raise CodecError(f"an integer with more than {MAX_INT_BITS} bits{_at(where)}")
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray | np.generic):
        return _encode_numpy(np, value, where, budget)
    for base in (bool, int, float, str):  # subclasses (IntEnum, ...) travel as their base type
        if isinstance(value, base):
            return _encode(base(value), where, depth + 1, budget)
    if isinstance(value, complex):
        return {COMPLEX: [value.real, value.imag]}
    if isinstance(value, list | tuple):
        return [_encode(item, f"{where}[{i}]", depth + 1, budget) for i, item in enumerate(value)]
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                name = type(key).__name__
                raise CodecError(f"a dict key that is not a string ({name}){_at(where)}")
            if _is_marker(key):
                raise CodecError(f"the reserved dict key {key!r}{_at(where)}")
            _check_text(key, where)
            _spend(budget, len(key) + 3)
            encoded[str(key)] = _encode(item, f"{where}[{key!r}]", depth + 1, budget)
        return encoded
    raise CodecError(f"an unsupported type: {kind.__name__}{_at(where)}")


def _encode_numpy(np: Any, value: Any, where: str, budget: list[int]) -> Any:
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        if isinstance(value, np.complexfloating):
            return {COMPLEX: [float(value.real), float(value.imag)]}
        raise CodecError(f"an unsupported type: numpy.{type(value).__name__}{_at(where)}")
    dtype = value.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f"a numpy array of unsupported dtype {dtype}{_at(where)}")
    _spend(budget, (value.nbytes + 2) // 3 * 4)
    little = dtype.newbyteorder("<")  # one byte order on the wire
    data = value.astype(little, copy=False).tobytes(order="C")
    return {ARRAY: [little.str, list(value.shape), base64.b64encode(data).decode("ascii")]}


def _decode(value: Any, where: str, depth: int, budget: list[int]) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError(f"a value nested deeper than {MAX_DEPTH} levels{_at(where)}")
    _count(budget)
    kind = type(value)
    if kind is str:
        _check_text(value, where)
    elif kind is int and value.bit_length() > MAX_INT_BITS:
        raise CodecError(f"an integer with more than {MAX_INT_BITS} bits{_at(where)}")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [_decode(item, f"{where}[{i}]", depth + 1, budget) for i, item in enumerate(value)]
    if kind is not dict:
        raise CodecError(f"an unexpected {kind.__name__}{_at(where)}")
    markers = [key for key in value if _is_marker(key)]
    if not markers:
        decoded = {}
        for key, item in value.items():
            _check_text(key, where)
            decoded[key] = _decode(item, f"{where}[{key!r}]", depth + 1, budget)
        return decoded
    if len(value) != 1:
        raise CodecError(f"the marker {markers[0]!r} beside other keys{_at(where)}")
    if ARRAY in value:
        return _decode_array(value[ARRAY], where)
    if COMPLEX in value:
        parts = value[COMPLEX]
        if (
            type(parts) is not list
            or len(parts) != 2
            or not all(type(part) in (int, float) for part in parts)
        ):
            raise CodecError(f"a malformed complex number{_at(where)}")
        try:  # an int part may be too large for a float
            return complex(float(parts[0]), float(parts[1]))
        except OverflowError:
            raise CodecError(f"a complex number too large for floats{_at(where)}") from None
    raise CodecError(f"the unknown marker {markers[0]!r}{_at(where)}")


def _decode_array(spec: Any, where: str) -> Any:
    if type(spec) is not list or len(spec) != 3:
        raise CodecError(f"a malformed array{_at(where)}")
    dtype_text, shape, data = spec
    if type(dtype_text) is not str or not _NUMERIC_DTYPE.fullmatch(dtype_text):
        raise CodecError(f"an array of unsupported dtype {str(dtype_text)[:40]!r}{_at(where)}")
    try:
        import numpy as np
    except ImportError as exc:  # the sandbox's interpreter lacks it: say so, never die mute
        raise CodecError(f"an array{_at(where)}, but numpy does not import here: {exc}") from None

    try:
        dtype = np.dtype(dtype_text)
    except TypeError:
        raise CodecError(f"an array of unknown dtype {dtype_text!r}{_at(where)}") from None
    if (
        type(shape) is not list
        or len(shape) > 32
        or not all(type(n) is int and 0 <= n < MAX_DIMENSION for n in shape)
    ):
        raise CodecError(f"an array with a malformed shape{_at(where)}")
    if type(data) is not str:
        raise CodecError(f"an array without base64 data{_at(where)}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError(f"an array whose data is not base64{_at(where)}") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise CodecError(
            f"an array whose {len(raw)} bytes do not fit shape {tuple(shape)} and dtype {dtype}"
            f"{_at(where)}"
        )
    try:  # numpy refuses some empty shapes whose product of the other axes overflows
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    except ValueError:
        raise CodecError(f"an array of impossible shape {tuple(shape)}{_at(where)}") from None
    # astype copies: the result is writable, owns its memory and has native byte order
    return array.astype(dtype.newbyteorder("="))


# ---------------------------------------------------------------------------------------------
# Frames: an 8-byte big-endian length, then the body.

LENGTH = struct.Struct("!Q")


def write_frame(fd: int, body: bytes) -> None:
    _write_all(fd, LENGTH.pack(len(body)))
    _write_all(fd, body)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> bytes | None:
    head = _read_exact(fd, LENGTH.size)
    return None if head is None else _read_exact(fd, LENGTH.unpack(head)[0])


# ---------------------------------------------------------------------------------------------
# Linux system calls Python 3.11 does not wrap.

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_CAPABILITY_VERSION_3 = 0x20080522


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what} failed: {os.strerror(number)}")


def unshare(flags: int) -> None:
    _check(_libc().unshare(flags), "unshare")


def _setns(fd: int, kind: int) -> None:
    _check(_libc().setns(fd, kind), "setns")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encoded = [None if text is None else text.encode() for text in (source, target, fstype)]
    result = _libc().mount(*encoded, flags, data.encode() or None)
    _check(result, f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _check(_libc().prctl(option, value, 0, 0, 0), "prctl")


def _drop_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for two 32-bit words
    _check(_libc().capset(header, data), "capset")


# ---------------------------------------------------------------------------------------------
# Control groups, prepared by the harness (`confinement.py`): the files are opened once,
# before the file system is locked, and each candidate moves itself in before anything else.


class _ControlGroups:
    def __init__(self, paths: dict[str, Any], isolation: list[str], warnings: list[str]) -> None:
        self.paths, self.isolation, self.warnings = paths, isolation, warnings
        self.procs: list[int] = []
        self.memory_limit = self.pids_limit = self.memory_events = None
        self.armed: dict[int, int] = {}  # fd -> the value written last

    def open(self) -> None:
        try:
            self.procs = [
                os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in self.paths.get("procs", ())
            ]
            for name in ("memory_limit", "pids_limit"):
                if name in self.paths:
                    setattr(self, name, os.open(self.paths[name], os.O_WRONLY | os.O_CLOEXEC))
            if "memory_events" in self.paths:
                self.memory_events = os.open(
                    self.paths["memory_events"], os.O_RDONLY | os.O_CLOEXEC
                )
        except OSError as exc:
            self.procs = []
            self.warnings.append(f"shared memory not counted: control group unusable: {exc}")
            return
        if self.memory_limit is not None:
            self.isolation.append("memory-cgroup")
        if self.pids_limit is not None:
            self.isolation.append("pids-cgroup")

    def arm(self, limits: dict[str, Any], warnings: list[str]) -> None:
        """Set this evaluation's limits (the last candidate's processes are all gone)."""
        for fd, value in (
            (self.memory_limit, limits["memory_mb"] << 20),
            (self.pids_limit, limits["max_processes"]),
        ):
            if fd is None or self.armed.get(fd) == value:
                continue
            try:
                os.write(fd, str(value).encode())
                self.armed[fd] = value
            except OSError as exc:
                self.armed.pop(fd, None)
                warnings.append(f"control group limit {value} not set: {exc.strerror}")

    def join(self) -> None:
        for fd in self.procs:
            os.write(fd, b"0")  # 0: the writing process itself, in v1 and v2 alike

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed in this slot's group so far."""
        if self.memory_events is None:
            return 0
        try:
            text = os.pread(self.memory_events, 4096, 0).decode()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


# ---------------------------------------------------------------------------------------------
# A seccomp filter through libseccomp (the maintained library, called with ctypes so that the
# fork server stays standard-library Python). Everything is allowed but what no scored program
# needs and a hostile one could use against the host or other candidates.

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ERRNO = 0x00050000  # | errno
SCMP_CMP_MASKED_EQ = 7
SCMP_FLTATR_CTL_TSYNC = 4
# fcntl's commands that take, wait for or look for a lock or a lease on a file (on a 64-bit
# system the F_*LK64 commands are these numbers)
LOCK_COMMANDS = (
    fcntl.F_GETLK, fcntl.F_SETLK, fcntl.F_SETLKW, fcntl.F_OFD_GETLK, fcntl.F_OFD_SETLK,
    fcntl.F_OFD_SETLKW, fcntl.F_SETLEASE,
)  # fmt: skip
FORBIDDEN_CALLS = (
    # namespaces, mounts and the root directory
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    # kernel keyrings, which outlive the process
    "keyctl", "add_key", "request_key",
    # other processes' memory, and kernel interfaces with a record of exploits
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at",
    # administering the machine
    "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "vhangup",
)  # fmt: skip
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    | 0x02000000  # CLONE_NEWCGROUP
)  # fmt: skip
SECCOMP_REASON = (
    "made a system call the sandbox forbids (seccomp: namespaces, mounts, keyrings, ptrace,"
    " bpf, perf events, io_uring or machine administration)"
)


class _ArgCompare(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _Seccomp:
    """The filter, built in the zygote; each candidate installs it on itself."""

    def __init__(self, library: ctypes.CDLL, context: int) -> None:
        self.library, self.context = library, context

    @classmethod
    def load(cls, warnings: list[str]) -> _Seccomp | None:
        try:
            library = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        except OSError:
            warnings.append("no seccomp filter: libseccomp.so.2 is not installed")
            return None
        library.seccomp_init.restype = ctypes.c_void_p
        library.seccomp_init.argtypes = [ctypes.c_uint32]
        library.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
            ctypes.POINTER(_ArgCompare),
        ]  # fmt: skip
        library.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        library.seccomp_load.argtypes = [ctypes.c_void_p]
        library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        context = library.seccomp_init(SCMP_ACT_ALLOW)
        if not context:
            warnings.append("no seccomp filter: seccomp_init failed")
            return None
        try:
            cls._rules(library, context)
        except OSError as exc:
            warnings.append(f"no seccomp filter: {exc}")
            return None
        return cls(library, context)

    @staticmethod
    def _rules(library: ctypes.CDLL, context: int) -> None:
        def add(action: int, name: str, *compare: tuple[int, int, int, int]) -> None:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # not a system call on this architecture
            array = (_ArgCompare * max(1, len(compare)))(*[_ArgCompare(*c) for c in compare])
            result = library.seccomp_rule_add_array(context, action, number, len(compare), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

        for name in FORBIDDEN_CALLS:
            add(SCMP_ACT_KILL_PROCESS, name)
        for bit in range(32):  # one rule per flag: a rule matches a masked value exactly
            if NAMESPACE_FLAGS & (1 << bit):
                add(SCMP_ACT_KILL_PROCESS, "clone", (0, SCMP_CMP_MASKED_EQ, 1 << bit, 1 << bit))
        # clone3 passes its flags in memory, where a filter cannot look: "not implemented" makes
        # the C library fall back to clone, whose flags it can
        add(SCMP_ERRNO | errno.ENOSYS, "clone3")
        # No socket of any family: the allowlist is empty, since no problem and nothing of the
        # sandbox's needs one, and the network namespace covers only some (AF_VSOCK reaches the
        # hypervisor, AF_UNIX a daemon's socket file or abstract name, even through a datagram
        # socketpair disconnected with AF_UNSPEC). A refusal, not a kill, because the C library
        # tries a Unix socket for user look-ups (nscd) before the files (none in view.py's root).
        add(SCMP_ERRNO | errno.EACCES, "socket")
        add(SCMP_ERRNO | errno.EACCES, "socketpair")
        # No file locks: a lock on a file the root shows is the host's lock on that file, which
        # could block a process outside or signal another sandbox. The kernel reads fcntl's
        # command as a 32-bit int, so the rule looks at those bits alone.
        add(SCMP_ERRNO | errno.ENOLCK, "flock")
        for command in LOCK_COMMANDS:
            add(SCMP_ERRNO | errno.ENOLCK, "fcntl", (1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, command))
        # No watches on files: the root shows other sandboxes the same host files, so an
        # inotify watch on one sees another candidate open it, a channel between the two.
        # "Not implemented": a library that watches files falls back to looking.
        for name in ("inotify_init", "inotify_init1", "fanotify_init"):
            add(SCMP_ERRNO | errno.ENOSYS, name)
        result = library.seccomp_attr_set(context, SCMP_FLTATR_CTL_TSYNC, 1)  # every thread
        if result < 0:
            raise OSError(-result, f"seccomp_attr_set: {os.strerror(-result)}")

    def install(self) -> None:
        result = self.library.seccomp_load(self.context)
        if result < 0:
            raise OSError(-result, f"seccomp_load failed: {os.strerror(-result)}")


# ---------------------------------------------------------------------------------------------
# The zygote.

_TMPFS_LAYOUT = ("/var/tmp", "/dev/shm")  # bind-mounted from the private /tmp, sharing its size
WORKDIR = "/tmp/work"
SETUP_FRAME_MAX = 4000  # below PIPE_BUF, so the candidate sees it written whole or not at all


class Zygote:
    def __init__(self, config: dict[str, Any], requests: int, replies: int) -> None:
        self.requests, self.replies = requests, replies
        self.root = os.geteuid() == 0
        self.uid: int | None = config["uid"] if self.root else None
        self.isolation: list[str] = []
        self.warnings: list[str] = list(config.get("warnings", ()))
        self.cgroup = _ControlGroups(config.get("cgroup") or {}, self.isolation, self.warnings)
        self.namespaces: bool = config["namespaces"]
        # what no candidate may read: the harness's packages, the problems' data (see sandbox.py)
        self.private: list[str] = list(config.get("private", ()))
        self.user_ns = self.net_ns = self.mount_ns = self.pid_ns = False
        if self.namespaces:
            self._enter_namespaces()
        else:
            self.warnings.append(
                "namespaces disabled: network, processes and files are not isolated"
            )
        self.host_pid = int(os.readlink("/proc/self"))  # our pid as the harness sees it
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a candidate come to us, not to init
        self.pid_ns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.cgroup.open()
        self.seccomp = _Seccomp.load(self.warnings)
        for name in config["preload"]:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the candidate gets the same error if it imports it
                self.warnings.append(f"could not preload {name}: {one_line(exc)}")
        # what a candidate's private /tmp covers but must bring back: folders, files and links
        # the interpreter needs that lie under /tmp (a virtual environment in a CI clone)
        self.under_tmp: tuple[list[str], list[tuple[str, str]]] = (
            [path for path in _python_folders() if _under_private_tmp(path)],
            [],
        )
        if self.mount_ns:  # after the preloads: the new root shows the libraries they loaded
            self._lock_filesystem()
        if self.private and not self.mount_ns:
            self.warnings.append(_readable(self.private, "no mount namespace"))
        gc.freeze()  # children then leave these objects' pages shared instead of copying them

    # -- start-up ---------------------------------------------------------------------------

    def _enter_namespaces(self) -> None:
        if self.root:
            try:
                unshare(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS)
                self.pid_ns = self.net_ns = self.mount_ns = True
            except OSError:  # e.g. a container without CAP_SYS_ADMIN: keep what works
                self.net_ns = self._try_unshare(CLONE_NEWNET, "network not isolated")
                self.mount_ns = self._try_unshare(CLONE_NEWNS, "files not isolated")
                self.pid_ns = self._try_unshare(CLONE_NEWPID, "processes not isolated")
        else:
            uid, gid = os.getuid(), os.getgid()
            try:
                unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS)
            except OSError as exc:
                self.warnings += [
                    f"{consequence}: creating a user namespace failed: {exc.strerror}"
                    for consequence in (
                        "network not isolated",
                        "processes not isolated",
                        "files not isolated",
                        "the candidate runs as the harness's own user",
                    )
                ]
                return
            # identity maps: files keep their owners, and an exec never makes the candidate root
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(text)
            self.user_ns = self.pid_ns = self.net_ns = self.mount_ns = True
            self.isolation.append("user-namespace")
        if self.net_ns:
            self.isolation.append("net-namespace")
        if self.pid_ns:
            self._become_pid_one()

    def _try_unshare(self, flag: int, consequence: str) -> bool:
        try:
            unshare(flag)
            return True
        except OSError as exc:
            self.warnings.append(f"{consequence}: unshare failed: {exc.strerror}")
            return False

    def _become_pid_one(self) -> None:
        """Fork; the child is pid 1 of the new namespace, so if it dies everything below it dies.

        The parent stays behind as the launcher: the harness's Popen waits on it and kills its
        process group, which holds the zygote too.
        """
        child = os.fork()
        if child:
            os.close(self.requests)
            os.close(self.replies)
            _, status = os.waitpid(child, 0)
            if os.WIFSIGNALED(status):  # die the same way, so the harness can say how it ended
                number = os.WTERMSIG(status)
                if number != signal.SIGKILL:
                    signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def _lock_filesystem(self) -> None:
        """Give this zygote and every candidate it forks a root that shows only what a Python
        program needs (`view.py`), read-only; where the OS refuses one, every mount read-only."""
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
        except OSError as exc:
            self.mount_ns = False
            self.warnings.append(f"files not isolated: {exc.strerror}")
            return
        view = _sibling("view")
        private = self.private  # those still in sight, to cover
        try:
            plan = view.plan(self.private)
            view.enter(plan, self.pid_ns, self.warnings)
            self.isolation.append("minimal-root")
            private = view.in_sight(plan, self.private)
            self.under_tmp = (
                [path for path in plan.shown if _under_private_tmp(path)],
                [link for link in plan.links if _under_private_tmp(link[0])],
            )
        except OSError as exc:
            self.warnings.append(
                "every world-readable file is readable to the candidate: no root of its own"
                f" ({exc.strerror or exc})"
            )
            self._whole_root()
        if self.private and _hide_all(private, self.warnings):
            self.isolation.append("private-paths-hidden")
        failed = []
        for target, options in _mount_points():
            if "ro" in options:
                continue
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            flags |= sum(bit for name, bit in _KEPT_FLAGS.items() if name in options)
            try:
                _mount(None, target, None, flags)
            except OSError as exc:
                if exc.errno == errno.ENOENT and _under_any(target, self.private):
                    continue  # a mount inside a covered private folder: out of sight
                failed.append(f"{target} ({exc.strerror})")
        if failed:
            self.warnings.append(f"still writable for the candidate: {', '.join(failed)}")
        else:
            self.isolation.append("read-only-filesystem")

    def _whole_root(self) -> None:
        """Without a root of its own the candidate sees every mount, as before view.py: then at
        least a /proc of its own, the interpreter readable to its uid, no /sys/fs/cgroup."""
        if self.pid_ns:
            try:  # a /proc that agrees with our pid namespace, and hides the host's processes
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except OSError as exc:
                self.warnings.append(f"host processes visible in /proc: {exc.strerror}")
        if self.uid is not None:
            self._expose_python()
        if os.path.isdir("/sys/fs/cgroup"):
            # candidates have no use for it, and our open control files keep working on a
            # detached mount, where no read-only remount below can be refused for them
            _libc().umount2(b"/sys/fs/cgroup", MNT_DETACH)

    def _expose_python(self) -> None:
        """Let the candidate's uid read the Python installation.

        An interpreter under a private home (pyenv or conda in a 0700 /root) would otherwise fail
        every import the zygote did not preload. The private directory is covered with a tmpfs
        that holds bind mounts of just the interpreter's folders; its other files stay hidden.
        """
        hidden: dict[str, list[str]] = {}
        for folder in _python_folders():
            blocker = _first_untraversable(folder, self.uid)
            if blocker is not None:
                hidden.setdefault(blocker, []).append(folder)
        for blocker, inside in hidden.items():
            handles = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in inside]
            try:
                _mount("tmpfs", blocker, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
                for path, handle in zip(inside, handles, strict=True):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    _mount(f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC)
            except OSError as exc:
                self.warnings.append(f"the candidate may not import from {blocker}: {exc}")
            finally:
                for handle in handles:
                    os.close(handle)

    def hello(self) -> None:
        hello = {"pid": self.host_pid, "isolation": self.isolation, "warnings": self.warnings}
        write_frame(self.replies, json.dumps(hello).encode())

    # -- serving ----------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            body = _read_frame(self.requests)
            if body is None:  # the harness closed the pipe or died
                return
            write_frame(self.replies, b"")  # received: from here on the candidate may run
            header, payload = self.evaluate(json.loads(body))
            write_frame(self.replies, json.dumps(header).encode())
            write_frame(self.replies, payload)

    def evaluate(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        limits = request["limits"]
        isolation, warnings = list(self.isolation), list(self.warnings)
        stdout = os.memfd_create("candidate-stdout")
        stderr = os.memfd_create("candidate-stderr")
        result_read, result_write = os.pipe()
        host_workdir = None if self.mount_ns else self._host_workdir()
        try:
            self.cgroup.arm(limits, warnings)
            oom_kills = self.cgroup.oom_kills()
            pid_ns = self._fresh_pid_namespace(warnings)
            if pid_ns:
                isolation.append("pid-namespace")
            sys.stdout.flush()
            sys.stderr.flush()
            started = time.monotonic()
            try:
                pid = os.fork()
            except OSError as exc:  # out of memory or processes: report it and keep serving
                pid = -1
                reason = f"could not fork: {exc.strerror}"
            if pid == 0:
                try:
                    Candidate(self, request).run(stdout, stderr, result_write, host_workdir, pid_ns)
                finally:  # whatever happens, the child never returns into the zygote's loop
                    os._exit(70)
            if pid_ns:  # our next fork must not land in that namespace
                _setns(self.pid_ns_fd, CLONE_NEWPID)
            if pid < 0:
                return _unstarted(reason, isolation, warnings), b""
            os.close(result_write)
            result_write = -1
            end, status, cpu, received = self._supervise(pid, result_read, started, limits)
            seconds = time.monotonic() - started
            if not pid_ns:
                self._sweep()
            header: dict[str, Any] = {
                "end": end,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "stdout": _tail(stdout, limits["output_chars"]),
                "stderr": _tail(stderr, limits["output_chars"]),
            }
            if os.WIFSIGNALED(status):
                header["signal"] = os.WTERMSIG(status)
            else:
                header["code"] = os.WEXITSTATUS(status)
            if self.cgroup.oom_kills() > oom_kills:
                header["memory_exceeded"] = True
            payload = _split_setup(received, header, isolation, warnings)
            header["isolation"], header["warnings"] = isolation, warnings
            if end == "exited" and len(payload) > limits["result_mb"] << 20:
                header["end"] = "oversize"
            return header, payload if header["end"] == "exited" else b""
        finally:
            for fd in (stdout, stderr, result_read, result_write):
                if fd >= 0:
                    os.close(fd)
            if host_workdir is not None:
                shutil.rmtree(host_workdir, ignore_errors=True)

    def _host_workdir(self) -> str:
        path = tempfile.mkdtemp(prefix="vpo-candidate-")
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        return path

    def _fresh_pid_namespace(self, warnings: list[str]) -> bool:
        if not self.namespaces or not (self.root or self.user_ns):
            return False
        try:
            # a process may create one pid namespace for its children; joining our own again
            # re-arms unshare for the next one
            _setns(self.pid_ns_fd, CLONE_NEWPID)
            unshare(CLONE_NEWPID)
            return True
        except OSError as exc:
            warnings.append(f"processes not isolated: {exc.strerror}")
            return False

    def _supervise(
        self, pid: int, result: int, started: float, limits: dict[str, Any]
    ) -> tuple[str, int, float, bytes]:
        """Wait for the candidate to exit, its time to run out or its result to grow too big."""
        deadline = started + limits["wall_seconds"]
        cap = (limits["result_mb"] << 20) + SETUP_FRAME_MAX + LENGTH.size
        received = bytearray()
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # before Linux 5.3: look at the child every few milliseconds instead
            pidfd = None
        poller = select.poll()
        poller.register(result, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        poller.register(self.requests, 0)  # reports only a hang-up: the harness went away
        end = None
        try:
            while end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    end = "timeout"
                    break
                wait = left if pidfd is not None else min(left, 0.005)
                for fd, _ in poller.poll(math.ceil(wait * 1000)):
                    if fd == self.requests:
                        _kill(pid, pidfd)
                        self._sweep()
                        raise SystemExit(0)
                    if fd == pidfd:
                        end = "exited"
                    elif fd == result and not _read_some(result, received, cap, poller):
                        end = "oversize"
                        break
                if pidfd is None and end is None and _has_exited(pid):
                    end = "exited"
            _kill(pid, pidfd)
            _, status, usage = os.wait4(pid, 0)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        if end == "exited":  # every writer is gone now: take what is left in the pipe
            os.set_blocking(result, False)
            try:
                while _read_some(result, received, cap, None):
                    pass
                end = "oversize"
            except (BlockingIOError, EOFError):
                pass
        return end, status, usage.ru_utime + usage.ru_stime, bytes(received)

    def _sweep(self) -> None:
        """Kill whatever the candidate left behind outside a pid namespace of its own."""
        if self.pid_ns:
            # we are pid 1 here: kill(-1) reaches every other process in our namespace, which
            # holds nothing but candidates
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap_all(block=True)
            return
        # as a subreaper we inherit every orphan, so killing our children until none remain
        # gets daemons that called setsid() too
        while children := _children_of(os.getpid()):
            for child in children:
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for child in children:  # their own children are ours once they are gone
                try:
                    os.waitpid(child, 0)
                except ChildProcessError:
                    pass


def _reap_all(block: bool) -> None:
    try:
        while os.waitpid(-1, 0 if block else os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


# a remount must repeat these, or a user namespace refuses it (the flags are locked there)
_KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1 << 10,
    "nodiratime": 1 << 11,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}


def _mount_points() -> list[tuple[str, set[str]]]:
    """Mount points from /proc/self/mountinfo, each with its per-mount options."""
    seen: dict[str, set[str]] = {}
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            seen[target] = set(fields[5].split(","))
    return list(seen.items())


def _python_paths() -> set[str]:
    """Every folder the interpreter imports from (prefixes and sys.path), resolved."""
    needed = [
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *sys.path,
    ]
    return {os.path.realpath(path) for path in needed if os.path.isdir(path)}


def _outermost(paths: set[str]) -> list[str]:
    folders = sorted(paths)
    return [
        path
        for i, path in enumerate(folders)
        if not any(path.startswith(outer + "/") for outer in folders[:i])
    ]


def _python_folders() -> list[str]:
    """The outermost folders the interpreter imports from."""
    return _outermost(_python_paths())


def _mount_point(path: str, handle: int) -> None:
    """Make `path` a place to bind what `handle` refers to: a folder for a folder, else a file."""
    if stat.S_ISDIR(os.fstat(handle).st_mode):
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _sibling(name: str) -> types.ModuleType:
    """The module `name`.py beside this file, loaded by its path: the fork server runs this file
    as a script (`python -I`), with no package to import from and nothing of the harness."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"vpo_sandbox_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _hide(path: str) -> None:
    """Cover `path` in this mount namespace: a folder with an empty read-only tmpfs, a file with
    /dev/null. Folders the interpreter imports from that lie inside a covered folder (a virtual
    environment inside a checkout) are bound back, as they were."""
    if not os.path.isdir(path):
        _mount("/dev/null", path, None, MS_BIND)
        return
    keep = _outermost({folder for folder in _python_paths() if _under_any(folder, [path])})
    handles = [os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for folder in keep]
    try:
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount("tmpfs", path, "tmpfs", flags | (0 if keep else MS_RDONLY), "size=1m,mode=0755")
        if not keep:
            return
        for folder, handle in zip(keep, handles, strict=True):
            os.makedirs(folder, mode=0o755, exist_ok=True)
            # a bind keeps its source's flags: read-only in a candidate (the zygote's view is);
            # in the zygote, the remount of every mount that follows makes it so
            _mount(f"/proc/self/fd/{handle}", folder, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_RDONLY | flags)
    finally:
        for handle in handles:
            os.close(handle)


def _hide_all(paths: Iterable[str], warnings: list[str]) -> bool:
    """Cover each path still in view, a folder before what lies inside it; False, with a
    warning, if any stays readable."""
    failed = []
    for path in sorted(paths):
        if not os.path.lexists(path):  # gone already, with a folder covered before it
            continue
        try:
            _hide(path)
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror})")
    if failed:
        warnings.append(f"readable by the candidate: {', '.join(failed)}")
    return not failed


def _under_any(path: str, folders: list[str]) -> bool:
    return any(path.startswith(folder + "/") for folder in folders)


def _readable(paths: list[str], why: str) -> str:
    return f"readable by the candidate: {', '.join(sorted(paths))} ({why})"


def _under_private_tmp(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in ("/tmp", *_TMPFS_LAYOUT))


def _first_untraversable(path: str, uid: int | None) -> str | None:
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        ancestor = "/" + "/".join(parts[:depth])
        info = os.stat(ancestor)
        if not info.st_mode & 0o001 and info.st_uid != uid:
            return ancestor
    return None


def _children_of(parent: int) -> list[int]:
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses; the fields after the last ')' do not
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == parent:
            children.append(int(name))
    return children


def _kill(pid: int, pidfd: int | None) -> None:
    # by pid is safe too until we reap the child: its zombie keeps the pid and the group id
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read_some(fd: int, received: bytearray, cap: int, poller: select.poll | None) -> bool:
    """Append what the pipe holds; False once more than `cap` bytes came. EOFError at the end."""
    chunk = os.read(fd, 1 << 20)
    if not chunk:
        if poller is None:
            raise EOFError
        poller.unregister(fd)
        return True
    received += chunk
    return len(received) <= cap


def _split_setup(
    received: bytes, header: dict[str, Any], isolation: list[str], warnings: list[str]
) -> bytes:
    """Separate the frame the candidate process wrote before any candidate code ran."""
    if len(received) >= LENGTH.size:
        size = LENGTH.unpack_from(received)[0]
        if size <= SETUP_FRAME_MAX and len(received) >= LENGTH.size + size:
            try:
                setup = json.loads(received[LENGTH.size : LENGTH.size + size])
            except ValueError:
                setup = {"fatal": "the candidate process sent a malformed set-up frame"}
            isolation.extend(setup.get("isolation", ()))
            warnings.extend(setup.get("warnings", ()))
            if "fatal" in setup:
                header["setup_error"] = setup["fatal"]
            return received[LENGTH.size + size :]
    if header["end"] == "exited":
        header["setup_error"] = "the candidate process ended before its set-up finished"
    return b""


def _unstarted(reason: str, isolation: list[str], warnings: list[str]) -> dict[str, Any]:
    return {
        "end": "exited",
        "code": 0,
        "setup_error": reason,
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "stdout": "",
        "stderr": "",
        "isolation": isolation,
        "warnings": warnings,
    }


def _tail(fd: int, chars: int) -> str:
    if chars <= 0:
        return ""
    size = os.fstat(fd).st_size
    start = max(0, size - 4 * chars)  # UTF-8 needs at most 4 bytes a character
    return os.pread(fd, size - start, start).decode("utf-8", "replace")[-chars:]


def one_line(exc: BaseException, limit: int = 300) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    line = " ".join(f"{type(exc).__name__}: {text}".split()) if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# The candidate process: a fork of the zygote that locks itself down, then runs the code.


class Candidate:
    def __init__(self, zygote: Zygote, request: dict[str, Any]) -> None:
        self.zygote, self.request = zygote, request
        self.limits: dict[str, Any] = request["limits"]
        # what this process adds to the zygote's isolation; sent in the set-up frame
        self.isolation: list[str] = []
        self.warnings: list[str] = []

    def run(
        self, stdout: int, stderr: int, result: int, workdir: str | None, pid_ns: bool
    ) -> NoReturn:
        try:
            self.zygote.cgroup.join()  # first: all it allocates from here on is counted
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setsid()  # its own process group, which the zygote kills as a whole
            if workdir is None:
                workdir = self._private_tmp(mount_proc=pid_ns)
            elif self.request.get("private"):
                self.warnings.append(_readable(self.request["private"], "no mount namespace"))
            self._limit_resources()
            result = _arrange_fds(stdout, stderr, result)
            self._drop_privileges()
            self._prepare_interpreter(workdir)
            if self.zygote.seccomp is not None:
                try:
                    self.zygote.seccomp.install()
                    self.isolation.append("seccomp")
                except OSError as exc:
                    self.warnings.append(f"no seccomp filter: {exc}")
            if "referee" in self.request:  # the result comes from a process of its own
                self.isolation.append("referee")
            setup: dict[str, Any] = {"isolation": self.isolation, "warnings": self.warnings}
        except BaseException as exc:
            setup = {"fatal": one_line(exc)}
        frame = json.dumps(setup).encode()
        if len(frame) > SETUP_FRAME_MAX:
            setup["warnings"] = ["(too many warnings to list)"]
            frame = json.dumps(setup).encode()[:SETUP_FRAME_MAX]
        write_frame(result, frame)
        if "fatal" in setup:
            os._exit(0)
        if "referee" in self.request:
            self._refereed(result)
        resource.setrlimit(resource.RLIMIT_AS, (self.limits["memory_mb"] << 20,) * 2)
        message = self._call()
        _flush_stdio()
        body = _dump(message)
        if len(body) > self.limits["result_mb"] << 20:
            body = _dump({"error": f"return value larger than {self.limits['result_mb']} MB"})
        try:
            _write_all(result, body)
        finally:
            os._exit(0)

    def _private_tmp(self, mount_proc: bool) -> str:
        try:
            unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
            self.isolation += ["ipc-namespace", "uts-namespace"]
        except OSError:
            unshare(CLONE_NEWNS)
        size = max(64, 4 * self.limits["file_mb"])
        # A virtual environment or checkout under /tmp (a CI clone, say) would vanish under the
        # private tmpfs and break every import numpy did not do at preload: keep a handle on
        # each such folder (or file) now and bind it back, read-only, once the tmpfs is in place.
        shown_under_tmp, links_under_tmp = self.zygote.under_tmp
        handles = [os.open(path, os.O_PATH | os.O_CLOEXEC) for path in shown_under_tmp]
        _mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={size}m,nr_inodes=16384,mode=1777",
        )
        for target in _TMPFS_LAYOUT:
            if os.path.isdir(target) and not os.path.islink(target):
                source = "/tmp/." + target.strip("/").replace("/", "-")
                os.mkdir(source, 0o1777)
                os.chmod(source, 0o1777)
                _mount(source, target, None, MS_BIND)
        for path, handle in zip(shown_under_tmp, handles, strict=True):
            try:
                _mount_point(path, handle)
                _mount(f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC)
                _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            except OSError as exc:
                self.warnings.append(f"the candidate may not import from {path}: {exc.strerror}")
            finally:
                os.close(handle)
        for path, text in links_under_tmp:
            try:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                os.symlink(text, path)
            except OSError as exc:
                self.warnings.append(f"the candidate may not find {path}: {exc.strerror}")
        if os.path.isdir("/run"):  # sockets of system daemons (dbus, docker, ...) live there
            _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=755")
        # this call's own private paths (its problem's data): most went with the zygote's or
        # with the private /tmp already, and cost nothing here
        _hide_all(self.request.get("private", ()), self.warnings)
        os.mkdir(WORKDIR, 0o700)
        if self.zygote.uid is not None:
            os.chown(WORKDIR, self.zygote.uid, self.zygote.uid)
        self.isolation.append("mount-namespace")
        if mount_proc:
            try:  # a /proc that shows only the candidate's own processes
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except OSError as exc:
                self.warnings.append(f"host processes visible in /proc: {exc.strerror}")
        return WORKDIR

    def _limit_resources(self) -> None:
        limits = self.limits
        cpu = math.ceil(limits["cpu_seconds"])
        # soft == hard: the kernel sends SIGKILL at the limit (pid 1 ignores SIGXCPU)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # each open file can pin memory (a memfd, a pipe's buffers) that RLIMIT_AS never sees
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
        if self.zygote.uid is not None or self.zygote.user_ns:
            # counted per uid, so only meaningful when the candidate has a uid of its own
            resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"],) * 2)

    def _drop_privileges(self) -> None:
        uid = self.zygote.uid
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # all ids non-zero: the kernel clears every capability
            if os.getuid() != uid or os.geteuid() != uid:
                raise PermissionError(f"could not switch to uid {uid}")
            self.isolation.append(f"uid={uid}")
        elif self.zygote.user_ns:
            _drop_capabilities()
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # setuid programs cannot give privileges back
        self.isolation.append("no-new-privs")

    def _prepare_interpreter(self, workdir: str) -> None:
        os.chdir(workdir)
        os.umask(0o022)
        os.environ["HOME"] = workdir
        os.environ["TMPDIR"] = "/tmp"
        os.environ["PWD"] = workdir
        try:
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
        # every candidate would otherwise draw the same "random" numbers as its siblings
        if "random" in sys.modules:
            sys.modules["random"].seed()
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()

    def _call(self) -> dict[str, Any]:
        """Run the candidate; describe what happened as data."""
        try:
            args = decode(self.request["args"])
        except CodecError as exc:
            return {"error": f"the sandbox could not decode the arguments: {exc}"}
        name = self.request["entry"]
        program, error = _load(self.request["code"], name, self.limits)
        if program is None:
            return {"error": error}
        return _invoke(program[name], args, self.limits)

    def _refereed(self, result: int) -> NoReturn:
        """A call with a referee: trusted code (`request["referee"]`) that makes the call in a
        process of its own and reaches the candidate's functions only through
        `call_candidate(name, *args)`, each call one message on a pipe.

        This process forks the referee, which alone keeps the result pipe, and becomes a fresh
        interpreter (exec) that loads the candidate's program and answers the calls
        (`serve_calls`). So the candidate can write no result, and nothing of the fork server's
        memory reaches it: not the request, whose arguments only the referee reads (the
        instance a heuristic must see one item at a time), nor what earlier requests left.
        The referee is not dumpable, so the candidate's process (its parent, of the same uid)
        can neither read nor write its memory through /proc; it ignores every signal it can.
        This process stays the one the zygote watches: how the candidate ended is how the call
        ends, and the referee ends with it."""
        if not RUNNER_CODE:  # only `main` reads it: a fork server started otherwise has none
            _write_all(result, _dump({"error": "this fork server cannot run a refereed call"}))
            os._exit(0)
        calls_read, calls_write = os.pipe()
        answers_read, answers_write = os.pipe()
        runner = os.memfd_create("vpo-runner")
        _write_all(runner, RUNNER_CODE)
        _prctl(PR_SET_DUMPABLE, 0)  # before the fork: the referee is never dumpable
        referee = os.fork()
        if referee == 0:
            try:
                os.close(calls_read)
                os.close(answers_write)
                os.close(runner)
                _referee(self.request, result, _Channel(answers_read, calls_write))
            finally:
                os._exit(70)
        # fd 3, the result pipe, becomes the end the calls arrive on
        _keep_fds(calls_read, answers_write, runner)
        resource.setrlimit(resource.RLIMIT_AS, (self.limits["memory_mb"] << 20,) * 2)
        limits = [str(self.limits[name]) for name in ("result_mb", "file_mb")]
        try:
            os.execv(sys.executable, [sys.executable, "-I", "-c", _BOOT, str(referee), *limits])
        except OSError as exc:
            print(f"the candidate's interpreter did not start: {exc}", file=sys.stderr)
            _flush_stdio()
            os._exit(71)


def _load(code_text: str, entry: str, limits: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Run the program as the module `candidate`: its namespace, or None and why it could not
    run or defines no function `entry`."""
    try:
        code = compile(code_text, "<candidate>", "exec")
    except SyntaxError as exc:
        return None, f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    except (ValueError, TypeError) as exc:
        return None, one_line(exc)
    import linecache

    # lets tracebacks on the candidate's stderr show its source lines
    lines = code_text.splitlines(True)
    linecache.cache["<candidate>"] = (len(code_text), None, lines, "<candidate>")
    module = types.ModuleType("candidate")
    module.__file__ = "<candidate>"
    sys.modules["candidate"] = module  # dataclasses and pickle look modules up there
    me = os.getpid()
    try:
        exec(code, module.__dict__)
    except BaseException as exc:
        return None, _failure(exc, me, limits)
    if entry not in module.__dict__:
        return None, f"entry point {entry!r} is not defined"
    if not callable(module.__dict__[entry]):
        kind = type(module.__dict__[entry]).__name__
        return None, f"entry point {entry!r} is not callable ({kind})"
    return module.__dict__, ""


def _invoke(function: Any, args: list[Any], limits: dict[str, Any]) -> dict[str, Any]:
    """Call one of the candidate's functions; what it returned, encoded, or why it did not."""
    me = os.getpid()
    try:
        value = function(*args)
    except BaseException as exc:
        return {"error": _failure(exc, me, limits)}
    if os.getpid() != me:  # a fork returning from the entry point must not answer too
        os._exit(0)
    try:
        return {"value": value if _as_is(value) else encode(value, limits["result_mb"] << 20)}
    except TooLarge:
        return {"error": f"return value larger than {limits['result_mb']} MB"}
    except CodecError as exc:
        return {"error": f"returned {exc}"}
    except BaseException as exc:  # e.g. a list subclass whose __iter__ raises
        return {"error": f"returned a value that could not be encoded: {one_line(exc)}"}


def _failure(exc: BaseException, me: int, limits: dict[str, Any]) -> str:
    """Why the candidate's code raised `exc`; a fork of the candidate (not process `me`) ends."""
    if os.getpid() != me:
        os._exit(exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1)
    if isinstance(exc, SystemExit):
        return f"called sys.exit({'' if exc.code is None else repr(exc.code)})"
    try:  # the traceback goes to the candidate's stderr, without the sandbox's own frame
        tb = exc.__traceback__
        traceback.print_exception(type(exc), exc, tb.tb_next if tb else None)
    except BaseException:
        pass
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return f"wrote more than {limits['file_mb']} MB to a file (File too large)"
    return one_line(exc)


# ---------------------------------------------------------------------------------------------
# A refereed call: the referee and the candidate, each in a process of its own, speak in frames
# (JSON in the data format above) over two pipes. The referee sends the program, then one call
# at a time, [name, args]; the candidate answers each with {"value": ...} or {"error": ...}.

# This file's code, compiled by `main` while the fork server can still read the file (the
# candidate's root hides the harness): a refereed call's candidate runs it in a fresh interpreter.
RUNNER_CODE = b""
# What that interpreter runs (`python -I -c`): the calls arrive on fd 3, the answers leave on
# fd 4, this file's code is in fd 5.
_BOOT = """\
import marshal, os, sys
runner = {"__name__": "vpo_runner"}
exec(marshal.loads(os.pread(5, os.fstat(5).st_size, 0)), runner)
os.close(5)
runner["serve_calls"](3, 4, *map(int, sys.argv[1:]))
"""


class CandidateError(Exception):
    """A call to the candidate's process that returned nothing: the message says why (what its
    function raised, or what it answered instead of data)."""


class _Channel:
    """Frames to and from the other process of a refereed call, read through a buffer: a call
    and its answer are often a few bytes, one read each."""

    # one encoder for every message: json.dumps with options builds a new one each time, which
    # costs more than the rest of a small call's round trip
    _json = json.JSONEncoder(allow_nan=True, separators=(",", ":"))

    def __init__(self, incoming: int, outgoing: int) -> None:
        self.incoming, self.outgoing = incoming, outgoing
        self.buffer = bytearray()

    def send(self, message: Any) -> None:
        body = self._json.encode(message).encode()
        _write_all(self.outgoing, LENGTH.pack(len(body)) + body)

    def receive(self, limit: int) -> bytearray | None:
        """The next frame's body; None at the end; TooLarge for a body above `limit` bytes."""
        buffer, wanted = self.buffer, LENGTH.size
        while True:
            if len(buffer) >= LENGTH.size:
                size = LENGTH.unpack_from(buffer)[0]
                if size > limit:
                    raise TooLarge(f"a message of {size} bytes")
                wanted = LENGTH.size + size
                if len(buffer) >= wanted:
                    body = buffer[LENGTH.size : wanted]
                    del buffer[:wanted]
                    return body
            chunk = os.read(self.incoming, max(1 << 16, wanted - len(buffer)))
            if not chunk:
                return None
            buffer += chunk


def serve_calls(calls: int, answers: int, referee: int, result_mb: int, file_mb: int) -> NoReturn:
    """The candidate's side of a refereed call, in a fresh interpreter: load the program the
    referee sends, then answer its calls until it hangs up."""
    limits = {"result_mb": result_mb, "file_mb": file_mb}
    channel = _Channel(calls, answers)
    try:
        _answer_calls(channel, limits)
    except BrokenPipeError:  # the referee is gone: the zygote says how this process ended
        pass
    _flush_stdio()
    try:
        os.waitpid(referee, 0)  # its CPU time then counts with this process's
    except ChildProcessError:
        pass
    os._exit(0)


def _answer_calls(channel: _Channel, limits: dict[str, Any]) -> None:
    first = channel.receive(1 << 62)
    if first is None:
        return
    program, error = _load(*json.loads(first), limits)
    channel.send({"value": None} if program is not None else {"error": error})
    # Until the referee hangs up, which it does once its result is written: ending sooner would
    # end it before it wrote.
    while (body := channel.receive(1 << 62)) is not None:
        name, wire = json.loads(body)
        try:
            args = wire if _as_is(wire) else decode(wire)
        except CodecError as exc:
            channel.send({"error": f"the sandbox could not decode the arguments: {exc}"})
            continue
        function = None if program is None else program.get(name)
        if not callable(function):
            channel.send({"error": error or f"the program defines no function {name!r}"})
            continue
        channel.send(_invoke(function, args, limits))


def _referee(request: dict[str, Any], result: int, channel: _Channel) -> NoReturn:
    """The referee's process: run the referee's function on the call's arguments, its calls to
    the candidate going through `channel`, and write what it returned as the call's result."""
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_IGN)
            except (OSError, ValueError):
                pass
    limits = request["limits"]
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] << 20,) * 2)
    message = _referee_call(request, channel, limits)
    _flush_stdio()
    body = _dump(message)
    if len(body) > limits["result_mb"] << 20:
        body = _dump({"error": f"return value larger than {limits['result_mb']} MB"})
    try:
        _write_all(result, body)
    finally:
        os._exit(0)


def _referee_call(
    request: dict[str, Any], channel: _Channel, limits: dict[str, Any]
) -> dict[str, Any]:
    most = limits["result_mb"] << 20

    def answer() -> Any:
        try:
            body = channel.receive(most + 64)
        except TooLarge:
            raise CandidateError(f"return value larger than {limits['result_mb']} MB") from None
        if body is None:
            raise CandidateError("the candidate's process stopped answering")
        if structure_count(body) > MAX_VALUES + 1:
            raise CandidateError(f"returned more than {MAX_VALUES:,} values")
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            raise CandidateError("the candidate's process answered with malformed data") from None
        if type(message) is not dict or len(message) != 1:
            raise CandidateError("the candidate's process answered with malformed data")
        if "error" in message:
            raise CandidateError(str(message["error"]))
        value = message.get("value")
        try:
            return value if _as_is(value) else decode(value)
        except CodecError as exc:
            raise CandidateError(f"returned {exc}") from None

    def call_candidate(name: str, *args: Any) -> Any:
        """`name(*args)` in the candidate's process: what it returned, as data."""
        wire = list(args)
        channel.send([name, wire if _as_is(wire) else encode(wire)])
        return answer()

    referee = request["referee"]
    try:
        channel.send([request["code"], request["entry"]])
        answer()  # the program ran and defines its entry point
        args = decode(request["args"])
        namespace: dict[str, Any] = {
            "__name__": "referee",
            "call_candidate": call_candidate,
            "CandidateError": CandidateError,
        }
        exec(compile(referee["code"], "<referee>", "exec"), namespace)
        value = namespace[referee["entry"]](*args)
        return {"value": encode(value, most)}
    except CandidateError as exc:
        return {"error": str(exc)}
    except BaseException as exc:  # the referee refused what the candidate answered
        return {"error": _failure(exc, os.getpid(), limits)}


def _as_is(value: Any, depth: int = 2) -> bool:
    """Whether the codec would pass `value` through unchanged: a number, a boolean or None, or a
    short list of them, two levels deep at most. A refereed call's messages are mostly such, and
    need not be walked (strings are, for surrogates)."""
    kind = type(value)
    if kind is int:
        return value.bit_length() <= MAX_INT_BITS
    if kind is float or kind is bool or value is None:
        return True
    return (
        kind is list
        and depth > 0
        and len(value) <= 100
        and all(_as_is(v, depth - 1) for v in value)
    )


def _keep_fds(*fds: int) -> None:
    """Put `fds` on 3, 4, ... in order, inheritable, and close every other descriptor above 2."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + len(fds)) for fd in fds]
    for number, fd in enumerate(high, start=3):
        os.dup2(fd, number)
    os.closerange(3 + len(fds), 1 << 30)


def _arrange_fds(stdout: int, stderr: int, result: int) -> int:
    """stdin /dev/null, stdout and stderr to the zygote's memfds, the result pipe on fd 3,
    nothing else open."""
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.dup2(result, 3)
    os.closerange(4, 1 << 30)  # not SC_OPEN_MAX: RLIMIT_NOFILE was lowered below open fds' numbers
    return 3


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()  # type: ignore[union-attr]
        except BaseException:
            pass


def _dump(message: dict[str, Any]) -> bytes:
    try:
        return json.dumps(message, allow_nan=True, separators=(",", ":")).encode()
    except (ValueError, TypeError, RecursionError) as exc:
        return json.dumps({"error": f"returned a value that could not be encoded: {exc}"}).encode()


def _take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes off fds 0 and 1, so that a stray print cannot corrupt a frame."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return requests, replies


def main(argv: list[str]) -> None:
    global RUNNER_CODE
    with open(__file__, "rb") as handle:
        RUNNER_CODE = marshal.dumps(compile(handle.read(), __file__, "exec"))
    config = json.loads(argv[1])
    requests, replies = _take_protocol_fds()
    os.chdir("/")
    os.umask(0o022)
    zygote = Zygote(config, requests, replies)
    zygote.hello()
    try:
        zygote.serve()
    except BrokenPipeError:  # the harness went away while we answered
        pass


if __name__ == "__main__":
    main(sys.argv)
