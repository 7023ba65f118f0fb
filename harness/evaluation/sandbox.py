"""Run untrusted candidate code in a child process and get back only data.

A candidate program written by a model runs as `entry(*args)` in a process of its own; what comes
back is JSON-like data or numeric numpy arrays, decoded strictly here, and trusted code scores
it. Nothing a candidate produces is unpickled or executed by the harness.

Each worker slot is a fork server (`zygote.py`): a Python process started once, with
numpy already imported, that forks one child per evaluation, so an evaluation costs a fork rather
than an interpreter start. The child, when the OS allows:

- is pid 1 of a fresh pid namespace: when it ends, the kernel kills everything it started;
- sees no network (a network namespace without interfaces) and a read-only file system with a
  private, size-limited /tmp (its working directory is /tmp/work);
- finds the private paths empty (`default_private_paths()`: the harness's own packages, the
  problems' data with them, and the project checkout they run from; and each call's own, its
  problem's data), so it can neither read a problem's held-out answers nor import the harness;
- runs, when the harness is root, as uid 61000 + slot with no capabilities, so it can neither
  write the project tree or the database nor signal the harness; when not root, inside a user
  namespace instead;
- has rlimits on CPU time, address space, file size and processes, and a wall-clock deadline
  after which its whole process group and pid namespace are killed.

What was applied is listed in `Outcome.isolation`; what could not be is in `Outcome.warnings`.

    with Sandbox(workers=4) as sandbox:
        outcome = sandbox.run("def f(n):\\n    return list(range(n))", "f", (3,))
        outcome.status, outcome.value        # ("ok", [0, 1, 2])
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.config.errors import UserError
from harness.evaluation import confinement, zygote
from harness.evaluation.results import decode_message, storable

_ZYGOTE = Path(zygote.__file__).resolve()
_GRACE_SECONDS = 5.0  # the zygote enforces the deadline; this only catches a stuck zygote
_START_SECONDS = 120.0  # a zygote imports numpy; allow for a loaded machine
_HEADER_MAX = 16 << 20  # a reply header holds two output tails and a few short lists


@dataclass(frozen=True)
class Limits:
    """What one evaluation may use. Sizes are in MiB."""

    wall_seconds: float = 10.0
    cpu_seconds: float | None = None  # None: wall_seconds + 1
    memory_mb: int = 2048  # address space (RLIMIT_AS), numpy's own mappings included
    file_mb: int = 64  # largest file, stdout and stderr included (RLIMIT_FSIZE)
    max_processes: int = 32  # RLIMIT_NPROC; counted per uid, so only with a uid of its own
    output_chars: int = 4000  # tail of stdout and of stderr kept in the Outcome
    result_mb: int = 64  # largest encoded return value accepted
    open_files: int = 256  # RLIMIT_NOFILE: each can pin memory (a memfd) RLIMIT_AS does not see

    def __post_init__(self) -> None:
        names = ("wall_seconds", "memory_mb", "file_mb", "max_processes", "result_mb", "open_files")
        for name in names:
            if not getattr(self, name) > 0:
                raise UserError(f"sandbox limit {name} must be positive, not {getattr(self, name)}")
        if self.cpu_seconds is not None and not self.cpu_seconds > 0:
            raise UserError(f"sandbox limit cpu_seconds must be positive, not {self.cpu_seconds}")
        if self.output_chars < 0:
            raise UserError(f"sandbox limit output_chars must be >= 0, not {self.output_chars}")

    @property
    def cpu_limit(self) -> float:
        return self.wall_seconds + 1 if self.cpu_seconds is None else self.cpu_seconds


@dataclass(frozen=True)
class Outcome:
    """What one evaluation gave: the decoded return value, or why there is none."""

    status: Literal["ok", "error", "timeout"]
    value: Any  # the decoded return value when status == "ok", else None
    reason: str | None  # one line; None when ok
    stdout: str  # tails
    stderr: str
    seconds: float
    isolation: tuple[str, ...]  # what was applied, e.g. ("pid-namespace", "uid=61001")
    warnings: tuple[str, ...]  # what could not be, e.g. ("network not isolated: ...",)


@dataclass(frozen=True)
class Call:
    """One evaluation for `Sandbox.map`."""

    code: str
    entry: str
    args: tuple = ()
    limits: Limits | None = None
    private_paths: tuple[str, ...] = ()  # hidden from this call only (see `Sandbox.run`)


def default_private_paths() -> tuple[str, ...]:
    """What no candidate may read, by default: the folders of the project's packages (harness,
    problems, trainer: the problems' data, their held-out test targets and published solutions
    among them) and, when they run from a checkout (a folder with pyproject.toml, as in an
    editable install), the whole checkout: its examples, tests and git history hold the same
    data. A virtual environment inside the checkout stays visible, as the interpreter needs it.
    """
    found = set()
    for name in ("harness", "problems", "trainer"):
        spec = importlib.util.find_spec(name)
        for location in (spec and spec.submodule_search_locations) or ():
            package = os.path.realpath(location)
            found.add(package)
            checkout = os.path.dirname(package)
            if checkout != "/" and os.path.isfile(os.path.join(checkout, "pyproject.toml")):
                found.add(checkout)
    return tuple(sorted(found))


def _existing(paths: Iterable[str]) -> list[str]:
    """Absolute, symlinks resolved (the zygote covers the real folder), only those that exist."""
    resolved = {os.path.realpath(path) for path in paths}
    return sorted(path for path in resolved if os.path.lexists(path))


class Sandbox:
    """A pool of `workers` fork servers; `run` is thread-safe, `map` runs calls in parallel.

    `namespaces=False` skips every namespace (network, pid, mount); it exists for tests and for
    debugging, and the outcomes say what is then not isolated. `private_paths` (files or
    folders) are hidden from every candidate: each worker covers them once, with an empty
    read-only folder (a file with /dev/null), before it forks any; None hides
    `default_private_paths()`.
    """

    def __init__(
        self,
        workers: int | None = None,
        limits: Limits = Limits(),
        preload: tuple[str, ...] = ("numpy",),
        *,
        namespaces: bool = True,
        private_paths: Sequence[str] | None = None,
    ) -> None:
        workers = len(os.sched_getaffinity(0)) if workers is None else workers
        if workers < 1:
            raise UserError(f"the sandbox needs at least one worker, not {workers}")
        self.workers = workers
        self.limits = limits
        if private_paths is None:
            private_paths = default_private_paths()
        hidden = _existing(private_paths)
        slots = confinement.claim_slots(workers)
        self._workers = [_Worker(slot, tuple(preload), namespaces, hidden) for slot in slots]
        self._free: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._closed = False
        self._stop = weakref.finalize(self, _stop_all, list(self._workers))
        for worker in self._workers:
            worker.start()  # they import numpy in parallel while the caller gets ready
            self._free.put(worker)

    def run(
        self,
        code: str,
        entry: str,
        args: Sequence[Any] = (),
        limits: Limits | None = None,
        private_paths: Sequence[str] = (),
    ) -> Outcome:
        """Evaluate `entry(*args)` after running `code`. Raises only for the caller's mistakes.

        `private_paths` are hidden from this candidate on top of the sandbox's own: the candidate
        process covers each that is still in view (most lie in the sandbox's, for free).
        """
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        if not isinstance(code, str) or not isinstance(entry, str):
            raise TypeError("the sandbox runs code given as a str, with the entry point's name")
        limits = self.limits if limits is None else limits
        try:
            wire_args = zygote.encode(list(args))
        except zygote.CodecError as exc:
            raise TypeError(
                "sandbox arguments must be data (JSON values, tuples, numeric numpy arrays);"
                f" the arguments hold {exc}"
            ) from None
        request = {
            "code": code,
            "entry": entry,
            "args": wire_args,
            "limits": _wire(limits),
            "private": _existing(private_paths),
        }
        body = json.dumps(request, allow_nan=True).encode()
        worker = self._free.get()
        try:
            return worker.evaluate(body, limits)
        finally:
            self._free.put(worker)

    def map(self, calls: Iterable[Call]) -> list[Outcome]:
        """Run the calls in parallel, at most `workers` at a time; outcomes in input order."""
        calls = list(calls)

        def one(call: Call) -> Outcome:
            return self.run(call.code, call.entry, call.args, call.limits, call.private_paths)

        if len(calls) <= 1:
            return [one(call) for call in calls]
        threads = min(self.workers, len(calls))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sandbox") as pool:
            return list(pool.map(one, calls))

    def close(self) -> None:
        """Stop every worker and whatever it runs. Idempotent."""
        self._closed = True
        self._stop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pids(self) -> list[int]:
        """Launcher and zygote process ids of the workers now running (for tests)."""
        return [pid for worker in self._workers for pid in worker.pids()]


def _wire(limits: Limits) -> dict[str, Any]:
    return {
        "wall_seconds": limits.wall_seconds,
        "cpu_seconds": limits.cpu_limit,
        "memory_mb": limits.memory_mb,
        "file_mb": limits.file_mb,
        "max_processes": limits.max_processes,
        "output_chars": limits.output_chars,
        "result_mb": limits.result_mb,
        "open_files": limits.open_files,
    }


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.close_requests()  # each zygote kills its candidate and exits on end-of-file
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.stop(deadline)
        worker.slot.close()  # after its processes are gone: frees the uid and control groups


class _WorkerGone(Exception):
    """The zygote stopped answering or died."""


class _Worker:
    """One slot: a zygote process and the pipes to it. Used by one thread at a time."""

    def __init__(
        self,
        slot: confinement.Slot,
        preload: tuple[str, ...],
        namespaces: bool,
        private_paths: list[str],
    ) -> None:
        self.slot = slot
        config = {
            "uid": slot.uid,
            "cgroup": slot.cgroup,
            "warnings": slot.warnings,
            "preload": list(preload),
            "namespaces": namespaces,
            "private": private_paths,
        }
        self.argv = [sys.executable, "-I", str(_ZYGOTE), json.dumps(config)]
        self.process: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        self.closed = False
        self.lock = threading.Lock()  # guards process against close() from another thread

    def start(self) -> None:
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            # no BLAS or OpenMP thread pools may exist when the zygote forks
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "NUMEXPR_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1",
        }
        if "LD_LIBRARY_PATH" in os.environ:  # some Python installs need it to start at all
            env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        process = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            start_new_session=True,  # its own process group, killed as one; no terminal signals
        )
        for pipe in (process.stdin, process.stdout):
            os.set_blocking(pipe.fileno(), False)  # type: ignore[union-attr]
        self.process, self.hello = process, None

    def pids(self) -> list[int]:
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                return []
            return [self.process.pid] + ([self.hello["pid"]] if self.hello else [])

    def evaluate(self, request: bytes, limits: Limits) -> Outcome:
        started = time.monotonic()
        try:
            self._send(request)
            deadline = time.monotonic() + limits.wall_seconds + _GRACE_SECONDS
            header = json.loads(self._receive(deadline, _HEADER_MAX))
            payload = self._receive(deadline, (limits.result_mb << 20) + 4096)
        except BaseException as exc:
            # an interrupted exchange (Ctrl-C, ...) leaves a reply in the pipe that the next
            # request would read as its own: only a fresh zygote is in step again
            self._kill()
            if not isinstance(exc, _WorkerGone):
                raise
            if self.closed:
                reason = "the sandbox was closed during the evaluation"
            elif isinstance(exc.__cause__, TimeoutError):
                reason = f"timed out after {float(limits.wall_seconds)} s"
            else:
                reason = f"the sandbox worker died during the evaluation ({exc})"
            status = "timeout" if isinstance(exc.__cause__, TimeoutError) else "error"
            warning = f"the sandbox worker was restarted: {exc}"
            elapsed = time.monotonic() - started
            return Outcome(status, None, reason, "", "", elapsed, (), (warning,))
        return _outcome(header, payload, limits)

    def _send(self, request: bytes) -> None:
        """Send a request, starting or restarting the zygote as needed."""
        for attempt in range(2):
            self._ensure_ready()
            assert self.process is not None and self.process.stdin is not None
            try:
                _write_frame(self.process.stdin.fileno(), request)
                self._receive(time.monotonic() + _START_SECONDS, 0)  # taken, not yet run
                return
            except (_WorkerGone, BrokenPipeError, ConnectionResetError, ValueError, TimeoutError):
                # killed from outside between two evaluations: nothing ran, so start afresh
                self._kill()
                if attempt:
                    raise RuntimeError("the sandbox worker dies as soon as it starts") from None

    def _ensure_ready(self) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("the sandbox is closed")
            if self.process is None or self.process.poll() is not None:
                self._discard()
                self.start()
        if self.hello is None:
            try:
                self.hello = json.loads(self._receive(time.monotonic() + _START_SECONDS, 1 << 20))
            except _WorkerGone as exc:
                self._kill()
                raise RuntimeError(
                    f"the sandbox worker could not start ({exc}); its error output is above"
                ) from None

    def _receive(self, deadline: float, limit: int) -> bytes:
        assert self.process is not None and self.process.stdout is not None
        try:
            fd = self.process.stdout.fileno()
            (size,) = zygote.LENGTH.unpack(_read_exact(fd, zygote.LENGTH.size, deadline))
            if size > limit:
                raise _WorkerGone(f"it sent a frame of {size} bytes")
            return _read_exact(fd, size, deadline)
        except TimeoutError as exc:
            raise _WorkerGone("it stopped answering") from exc
        except (EOFError, OSError, ValueError) as exc:
            raise _WorkerGone(self._exit_description()) from exc

    def _exit_description(self) -> str:
        with self.lock:
            try:  # its pipe closed, so it is on its way out
                code = None if self.process is None else self.process.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            return "its pipe closed"
        if code >= 0:
            return f"exit status {code}"
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"

    def close_requests(self) -> None:
        with self.lock:
            self.closed = True
            if self.process is not None and self.process.stdin is not None:
                self.process.stdin.close()

    def stop(self, deadline: float) -> None:
        with self.lock:
            if self.process is not None:
                try:
                    self.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self._kill()

    def _kill(self) -> None:
        with self.lock:
            process = self.process
            if process is None:
                return
            if process.poll() is None:
                # the launcher is not reaped yet, so its group id cannot belong to anyone else;
                # the zygote shares the group, and what it runs dies with it
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
            self._discard()

    def _discard(self) -> None:
        if self.process is not None:
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
        self.process, self.hello = None, None


def _write_frame(fd: int, body: bytes) -> None:
    data = memoryview(zygote.LENGTH.pack(len(body)) + body)
    deadline = time.monotonic() + _START_SECONDS
    while data:
        _wait_for(fd, select.POLLOUT, deadline)
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            continue


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while size:
        _wait_for(fd, select.POLLIN, deadline)
        try:
            chunk = os.read(fd, min(size, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _wait_for(fd: int, event: int, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    poller = select.poll()
    poller.register(fd, event)
    poller.poll(left * 1000)


def _outcome(header: dict[str, Any], payload: bytes, limits: Limits) -> Outcome:
    """Turn the zygote's report on one candidate process into an Outcome."""

    def make(status: Literal["ok", "error", "timeout"], value: Any, reason: str | None) -> Outcome:
        return Outcome(
            status,
            value,
            None if reason is None else storable(reason),
            storable(header["stdout"]),
            storable(header["stderr"]),
            header["seconds"],
            tuple(header["isolation"]),
            tuple(header["warnings"]),
        )

    end = header["end"]
    if end == "timeout":
        return make("timeout", None, f"timed out after {float(limits.wall_seconds)} s")
    if "setup_error" in header:
        return make(
            "error", None, f"the sandbox could not set up the candidate: {header['setup_error']}"
        )
    if end == "oversize":
        return make("error", None, f"return value larger than {limits.result_mb} MB")
    if header.get("memory_exceeded"):
        return make(
            "error",
            None,
            f"memory limit exceeded ({limits.memory_mb} MB, shared memory"
            " and in-memory files included)",
        )
    if "signal" in header:
        return make("error", None, _signal_reason(header["signal"], header["cpu_seconds"], limits))
    if header["code"] != 0 or not payload:
        return make("error", None, f"exited with status {header['code']} without returning")
    status, value, reason = decode_message(payload)
    return make(status, value, reason)


def _signal_reason(number: int, cpu_seconds: float, limits: Limits) -> str:
    # rusage undercounts a little, hence the margin; SIGKILL at the limit is RLIMIT_CPU's doing
    if number == signal.SIGXCPU or (
        number == signal.SIGKILL and cpu_seconds >= 0.9 * limits.cpu_limit
    ):
        return "CPU time limit exceeded"
    if number == signal.SIGXFSZ:
        return f"wrote more than {limits.file_mb} MB to a file (SIGXFSZ)"
    if number == signal.SIGSYS:
        return zygote.SECCOMP_REASON
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    description = (signal.strsignal(number) or "unknown signal").lower()
    return f"killed by signal {name} ({description})"
