"""Run untrusted candidate code in a child process and get back only data.

A candidate program written by a model runs as `entry(*args)` in a process of its own; what comes
back is JSON-like data or numeric numpy arrays, decoded strictly here, and trusted code scores
it. Nothing a candidate produces is unpickled or executed by the harness.

Each worker slot is a fork server (`zygote.py`): a Python process started once, with
numpy already imported, that forks one child per evaluation, so an evaluation costs a fork rather
than an interpreter start. The child, when the OS allows:

- is pid 1 of a fresh pid namespace: when it ends, the kernel kills everything it started;
- sees no network (a network namespace without interfaces) and a root of its own that holds
  only what a Python program needs (`view.py`: the system's libraries, the interpreter, the
  folders on sys.path, a few devices), read-only, with a private, size-limited /tmp (its
  working directory is /tmp/work): no copy of a problem's data elsewhere on the machine is in it;
- finds the private paths absent or empty where that root would show them
  (`default_private_paths()`: the harness's own packages, the problems' data with them, and the
  project checkout they run from, but for a virtual environment inside it; and each call's own,
  its problem's data), so it can neither read a problem's held-out answers nor import the
  harness;
- runs, when the harness is root, as a uid of its own with no capabilities, so it can neither
  write the project tree or the database nor signal the harness; when not root, inside a user
  namespace instead;
- has rlimits on CPU time, address space, file size and processes, and a wall-clock deadline
  after which its whole process group and pid namespace are killed.

A call with a `Referee` runs trusted code beside the candidate: the referee gets the call's
arguments and makes the candidate's calls one at a time, and its own return value is the
result; the candidate's process, a fresh interpreter, gets only what each call passes it and can
write no result (see `run`).

What was applied is listed in `Outcome.isolation`; what could not be is in `Outcome.warnings`.

    with Sandbox(workers=4) as sandbox:
        outcome = sandbox.run("def f(n):\\n    return list(range(n))", "f", (3,))
        outcome.status, outcome.value        # ("ok", [0, 1, 2])
"""

from __future__ import annotations

import json
import os
import queue
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness.config.errors import UserError
from harness.evaluation import confinement, zygote
from harness.evaluation.calls import (
    Call,
    Limits,
    Outcome,
    Referee,
    default_private_paths,
    existing,
)
from harness.evaluation.slot import Slot, stop_all, wire


class Sandbox:
    """A pool of `workers` fork servers; `run` is thread-safe, `map` runs calls in parallel.

    `namespaces=False` skips every namespace (network, pid, mount); it exists for tests and for
    debugging, and the outcomes say what is then not isolated. `private_paths` (files or
    folders) are hidden from every candidate: each worker leaves them out of the candidates' root
    (or, inside a folder the root shows, covers them with an empty read-only folder, a file with
    /dev/null) before it forks any; None hides `default_private_paths()`.
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
        hidden = existing(private_paths)
        slots = confinement.claim_slots(workers)
        self._workers = [Slot(slot, tuple(preload), namespaces, hidden) for slot in slots]
        self._free: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._closed = False
        # CPU seconds the candidate processes took, all of them so far (for a campaign's
        # account of where its time goes: they run outside this process's clock).
        self.cpu_seconds = 0.0
        self._counting = threading.Lock()
        self._stop = weakref.finalize(self, stop_all, list(self._workers))
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
        referee: Referee | None = None,
    ) -> Outcome:
        """Evaluate `entry(*args)` after running `code`. Raises only for the caller's mistakes.

        `private_paths` are hidden from this candidate on top of the sandbox's own: the candidate
        process covers each that is still in view (most lie in the sandbox's, for free).

        With a `referee`, `referee.entry(*args)` runs instead, in a process of its own that no
        candidate code runs in, and what it returns is the outcome's value. `code` runs in a
        fresh interpreter (nothing of the worker's memory, so not `args` either) and must define
        `entry`; each `call_candidate(name, *call_args)` the referee makes runs `name` there
        and returns its value as data, or raises `CandidateError` (a name in the referee's
        namespace too) saying why it did not, which ends the call unless the referee catches
        it. The candidate's process cannot write the result: the pipe it goes through is the
        referee's alone.
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
            "limits": wire(limits),
            "private": existing(private_paths),
        }
        if referee is not None:
            request["referee"] = {"code": referee.code, "entry": referee.entry}
        body = json.dumps(request, allow_nan=True).encode()
        worker = self._free.get()
        try:
            outcome = worker.evaluate(body, limits)
        finally:
            self._free.put(worker)
        with self._counting:
            self.cpu_seconds += outcome.cpu_seconds
        return outcome

    def map(self, calls: Iterable[Call]) -> list[Outcome]:
        """Run the calls in parallel, at most `workers` at a time; outcomes in input order."""
        calls = list(calls)

        def one(call: Call) -> Outcome:
            return self.run(
                call.code, call.entry, call.args, call.limits, call.private_paths, call.referee
            )

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
