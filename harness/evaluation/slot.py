"""One worker slot of the sandbox: a fork server (`zygote.py`) started once, the framed pipe the
harness speaks to it through, and the decoding of a reply into an `Outcome` (a status, a value,
the reason a child died). `sandbox.Sandbox` keeps a pool of them."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from harness.evaluation import confinement, zygote
from harness.evaluation.calls import Limits, Outcome
from harness.evaluation.results import decode_message, storable

_ZYGOTE = Path(zygote.__file__).resolve()


_GRACE_SECONDS = 5.0  # the zygote enforces the deadline; this only catches a stuck zygote


_START_SECONDS = 120.0  # a zygote imports numpy; allow for a loaded machine


_HEADER_MAX = 16 << 20  # a reply header holds two output tails and a few short lists


def wire(limits: Limits) -> dict[str, Any]:
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


def stop_all(workers: list[Slot]) -> None:
    for worker in workers:
        worker.close_requests()  # each zygote kills its candidate and exits on end-of-file
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.stop(deadline)
        worker.slot.close()  # after its processes are gone: frees the uid and control groups


class SlotGone(Exception):
    """The zygote stopped answering or died."""


class Slot:
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
            if not isinstance(exc, SlotGone):
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
            except (SlotGone, BrokenPipeError, ConnectionResetError, ValueError, TimeoutError):
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
            except SlotGone as exc:
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
                raise SlotGone(f"it sent a frame of {size} bytes")
            return _read_exact(fd, size, deadline)
        except TimeoutError as exc:
            raise SlotGone("it stopped answering") from exc
        except (EOFError, OSError, ValueError) as exc:
            raise SlotGone(self._exit_description()) from exc

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
            float(header.get("cpu_seconds", 0.0)),
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
