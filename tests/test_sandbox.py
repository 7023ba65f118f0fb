"""The sandbox against hostile candidates: real processes, no mocks.

Every hostile candidate must end with a status and a one-line reason, the test process and the
sandbox's workers must survive, no process of the candidate may be left running, and nothing
outside the candidate's temporary folder may change.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import as_nobody, missing_isolation, needs_isolation, python_for_nobody
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from harness.config.errors import UserError
from harness.evaluation import confinement, zygote
from harness.evaluation.calls import Call, Limits, Outcome
from harness.evaluation.confinement import UID_COUNT, UID_FIRST
from harness.evaluation.sandbox import Sandbox

PROJECT = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2, limits=Limits(wall_seconds=2.0)) as sandbox:
        yield sandbox


@pytest.fixture(autouse=True)
def no_candidate_left_behind() -> Iterator[None]:
    yield
    if ROOT:  # candidates have uids of their own, so any process with one of ours is a leftover
        assert _candidate_processes() == []


def run(sandbox: Sandbox, code: str, *args: object, **limits: float) -> Outcome:
    outcome = sandbox.run(textwrap.dedent(code), "f", args, Limits(**limits) if limits else None)
    assert outcome.status in ("ok", "error", "timeout")
    if outcome.status == "ok":
        assert outcome.reason is None
    else:
        assert outcome.value is None
        assert outcome.reason and "\n" not in outcome.reason
    return outcome


def _candidate_processes() -> list[str]:
    """Processes running as a sandbox uid this process answers for: one it holds now (its
    sandboxes are idle between tests), or one it held before that nobody holds now, looked at
    while this process holds that uid's lock for a moment, so that no sandbox can start a
    candidate under it meanwhile. A uid it freed that another process (a second test suite on
    this machine) has claimed since is that process's, and so are its candidates."""
    uids = _uids_locked_here()
    probes = []
    try:
        for uid in sorted(confinement.claimed_here - uids):
            try:
                fd = os.open(confinement._LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process's now
                os.close(fd)
                continue
            probes.append(fd)
            uids.add(uid)
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            except (OSError, ValueError):
                continue
            if int(fields["Uid"].split()[0]) in uids:
                found.append(f"{status.parent.name} {fields['Name'].strip()}")
        return found
    finally:
        for fd in probes:
            os.close(fd)


def _uids_locked_here() -> set[int]:
    """The sandbox uids whose lock files this process has open: the ones it holds (a claim
    keeps the file open, locked, for the slot's life)."""
    uids = set()
    for link in Path("/proc/self/fd").iterdir():
        try:
            target = Path(os.readlink(link))
        except OSError:
            continue
        if target.parent == confinement._LOCKS and target.suffix == ".lock":
            uids.add(int(target.stem))
    return uids


def _processes_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _isolated(outcome: Outcome, what: str) -> None:
    if what not in outcome.isolation:
        missing_isolation(f"this OS did not allow {what}: {outcome.warnings}")


# --- data in, data out ---------------------------------------------------------------------


def test_numpy_arrays_and_data_round_trip_exactly(sandbox: Sandbox) -> None:
    arrays = [
        np.array([0.1, -0.0, np.nan, np.inf, -np.inf, 5e-324]),
        np.arange(12, dtype=np.int8).reshape(3, 4),
        np.array([np.iinfo(np.uint64).max, 0], dtype=np.uint64),
        np.array([[True, False]]),
        np.array([1 + 2j, np.nan * 1j], dtype=np.complex64),
        np.linspace(0, 1, 7, dtype=np.float16),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.arange(10.0)[::3],
        np.array([1.5, 2.5], dtype=">f8"),
        np.zeros((0, 3)),
        np.array(7.25),
    ]
    data = {"arrays": arrays, "nested": [1, "ü", None, True, 2.5, (3, 4)], "big": 2**100}
    outcome = run(
        sandbox,
        """
        import numpy as np
        def f(data):
            data["made"] = [np.float32(0.1), np.int64(-3), np.bool_(False), np.complex128(1j)]
            return data
        """,
        data,
    )
    assert outcome.status == "ok", outcome.reason
    value = outcome.value
    for sent, back in zip(arrays, value["arrays"], strict=True):
        assert back.dtype == sent.dtype.newbyteorder("=")
        assert back.shape == sent.shape
        assert back.tobytes() == sent.astype(back.dtype).tobytes()  # bit for bit, NaNs too
        assert back.flags.writeable
    assert value["nested"] == [1, "ü", None, True, 2.5, [3, 4]]  # tuples travel as lists
    assert value["big"] == 2**100
    assert value["made"] == [float(np.float32(0.1)), -3, False, 1j]


def test_returns_bad_data_faithfully(sandbox: Sandbox) -> None:
    # judging the data is the scorer's job; the sandbox only reports what came back
    nan = run(sandbox, "def f(): return [float('nan'), float('inf')]")
    assert nan.status == "ok" and math.isnan(nan.value[0]) and nan.value[1] == math.inf
    shape = run(sandbox, "import numpy as np\ndef f(): return np.ones((2, 3, 5))")
    assert shape.status == "ok" and shape.value.shape == (2, 3, 5)
    text = run(sandbox, "def f(): return 'not a packing'")
    assert text.value == "not a packing"
    huge = run(sandbox, "import numpy as np\ndef f(): return np.zeros(10**6)", result_mb=1)
    assert (huge.status, huge.reason) == ("error", "return value larger than 1 MB")
    unsupported = run(sandbox, "def f(): return [1, {2}]")
    assert unsupported.reason == "returned an unsupported type: set at [1]"
    objects = run(sandbox, "import numpy as np\ndef f(): return np.array([None])")
    assert objects.reason == "returned a numpy array of unsupported dtype object"


def test_reports_how_the_candidate_failed(sandbox: Sandbox) -> None:
    reasons = {
        "def f(\n    x,\n  y:": "SyntaxError: ",
        "g = 1": "entry point 'f' is not defined",
        "f = 3": "entry point 'f' is not callable (int)",
        "def f(): raise ValueError('bad\\nnews')": "ValueError: bad news",
        "import sys\ndef f(): sys.exit(3)": "called sys.exit(3)",
        "import os\ndef f(): os._exit(7)": "exited with status 7 without returning",
    }
    for code, reason in reasons.items():
        outcome = run(sandbox, code)
        assert outcome.status == "error"
        assert outcome.reason is not None and outcome.reason.startswith(reason), outcome.reason
    syntax = run(sandbox, "x = 1\n\ndef f(:\n    pass")
    assert syntax.reason == "SyntaxError: invalid syntax (line 3)"
    traceback = run(sandbox, "def g():\n    return 1 / 0\ndef f():\n    return g()")
    assert traceback.reason == "ZeroDivisionError: division by zero"
    assert "return 1 / 0" in traceback.stderr  # the candidate's source shows in its traceback


def test_output_tails_are_kept(sandbox: Sandbox) -> None:
    outcome = run(
        sandbox,
        """
        import sys
        def f():
            for i in range(10000):
                print(i)
            print("warning", file=sys.stderr)
            return 1
        """,
        output_chars=10,
    )
    assert outcome.stdout == "9998\n9999\n"
    assert outcome.stderr == "warning\n"


def test_parallel_map_returns_results_in_order(sandbox: Sandbox) -> None:
    code = "import time\ndef f(i):\n    time.sleep(0.05 * (i % 3))\n    return i * i"
    outcomes = sandbox.map(Call(code, "f", (i,)) for i in range(8))
    assert [o.value for o in outcomes] == [i * i for i in range(8)]


def test_candidates_do_not_share_state(sandbox: Sandbox) -> None:
    patched = run(
        sandbox,
        """
        import numpy as np, random
        np.sum = lambda *args, **kwargs: 42
        def f():
            return [int(np.sum([1, 2])), random.random(), float(np.random.random())]
        """,
    )
    assert patched.value[0] == 42
    fresh = run(
        sandbox,
        "import numpy as np, random\ndef f(): return [int(np.sum([1, 2])), random.random()]",
    )
    assert fresh.value[0] == 3
    assert fresh.value[1] != patched.value[1]  # reseeded: not every candidate draws the same


def test_a_candidate_that_forges_its_answer_gets_an_error(sandbox: Sandbox) -> None:
    # the candidate may rewrite the encoder in its own process; that only changes bytes
    forged = run(
        sandbox,
        """
        import base64, numpy as np
        base64.b64encode = lambda data: b"AAAA"
        def f(): return np.arange(5)
        """,
    )
    assert forged.status == "error"
    assert "3 bytes do not fit shape (5,)" in forged.reason
    garbage = run(sandbox, "import json\njson.dumps = lambda *a, **k: '{'\ndef f(): return 1")
    assert garbage.reason.startswith("sent a malformed result")
    marker = run(
        sandbox,
        """
        import os
        def f():
            os.write(3, b'{"value": {"__pickle__": "gASVAAAA"}}')
            os._exit(0)
        """,
    )
    assert marker.reason == (
        "returned data the sandbox cannot accept: the unknown marker '__pickle__'"
    )


def test_caller_mistakes_raise(sandbox: Sandbox) -> None:
    with pytest.raises(TypeError, match="the arguments hold an unsupported type: set at \\[0\\]"):
        sandbox.run("def f(x): return x", "f", ({1},))
    with pytest.raises(UserError, match="wall_seconds must be positive"):
        Limits(wall_seconds=0)


# --- hostile candidates --------------------------------------------------------------------


def test_endless_loop_times_out(sandbox: Sandbox) -> None:
    outcome = run(sandbox, "def f():\n    while True:\n        pass", wall_seconds=1)
    assert (outcome.status, outcome.reason) == ("timeout", "timed out after 1.0 s")
    assert 1 <= outcome.seconds < 2


def test_ignoring_sigterm_does_not_help(sandbox: Sandbox) -> None:
    code = """
        import signal, time
        def f():
            for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(number, signal.SIG_IGN)
            time.sleep(60)
        """
    assert run(sandbox, code, wall_seconds=1).status == "timeout"


def test_cpu_time_limit(sandbox: Sandbox) -> None:
    code = """
        import threading
        def spin():
            while True:
                pass
        def f():
            for _ in range(3):
                threading.Thread(target=spin, daemon=True).start()
            spin()
        """
    outcome = run(sandbox, code, wall_seconds=5, cpu_seconds=1)
    assert (outcome.status, outcome.reason) == ("error", "CPU time limit exceeded")


def test_fork_bomb(sandbox: Sandbox) -> None:
    code = """
        import os
        def f():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """
    outcome = run(sandbox, code, wall_seconds=1)
    assert outcome.status in ("timeout", "error")


def test_allocating_50_gb(sandbox: Sandbox) -> None:
    outcome = run(sandbox, "import numpy as np\ndef f(): return np.ones(50 * 2**30 // 8).sum()")
    assert outcome.status == "error"
    assert outcome.reason.startswith("MemoryError: Unable to allocate 50.0 GiB")


def test_writing_a_10_gb_file(sandbox: Sandbox) -> None:
    code = """
        def f():
            block = b"x" * 2**20
            with open("big", "wb") as handle:
                for _ in range(10 * 1024):
                    handle.write(block)
        """
    outcome = run(sandbox, code)
    assert (outcome.status, outcome.reason) == (
        "error",
        "wrote more than 64 MB to a file (File too large)",
    )


def test_printing_a_gigabyte(sandbox: Sandbox) -> None:
    outcome = run(sandbox, "def f():\n    for _ in range(2**20):\n        print('y' * 1023)")
    assert outcome.reason == "wrote more than 64 MB to a file (File too large)"
    assert len(outcome.stdout) == 4000 and set(outcome.stdout) == {"y", "\n"}


def test_segfault(sandbox: Sandbox) -> None:
    outcome = run(
        sandbox, "import ctypes\ndef f(): return ctypes.string_at(0xFFFF_FFFF_FFFF_0000, 10)"
    )
    assert outcome.reason == "killed by signal SIGSEGV (segmentation fault)"


def test_unbounded_recursion(sandbox: Sandbox) -> None:
    plain = run(sandbox, "def f(n=0):\n    return f(n + 1)")
    assert plain.reason.startswith("RecursionError: maximum recursion depth exceeded")
    raised = run(
        sandbox,
        """
        import sys
        sys.setrecursionlimit(10**7)
        class Deep:
            def __repr__(self):  # through C, so the C stack overflows rather than the limit
                return repr(self)
        def f():
            return repr(Deep())
        """,
        wall_seconds=1,
    )
    assert raised.status in ("error", "timeout")


def test_network_is_unreachable(sandbox: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        code = """
            import socket
            def f(port):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    return "connected"
                except OSError as error:
                    return str(error)
            """
        outcome = run(sandbox, code, server.getsockname()[1])
        _isolated(outcome, "net-namespace")
        assert outcome.value != "connected"
        with pytest.raises(BlockingIOError):
            server.accept()


def test_a_daemon_does_not_outlive_its_candidate(sandbox: Sandbox) -> None:
    code = """
        import os
        def f():
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["sleep", "987.654"])
                os._exit(0)
            return "launched"
        """
    assert run(sandbox, code).value == "launched"
    assert _processes_with("987.654") == []


def test_a_daemon_is_swept_without_namespaces() -> None:
    # without a pid namespace the zygote, a subreaper, must find and kill the orphans itself
    code = """
        import os, time
        def f(marker):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["sleep", marker])
                os._exit(0)
            time.sleep(0.2)
            return "launched"
        """
    with Sandbox(workers=1, namespaces=False, preload=()) as plain:
        outcome = run(plain, code, "986.421")
        assert outcome.value == "launched"
        assert "namespaces disabled" in outcome.warnings[0]
        assert _processes_with("986.421") == []


def test_cannot_write_outside_its_folder(sandbox: Sandbox, tmp_path: Path) -> None:
    _isolated(run(sandbox, "def f(): return 1"), "mount-namespace")
    protected = PROJECT / "harness" / "evaluation" / "sandbox.py"
    before = hashlib.sha256(protected.read_bytes()).hexdigest()
    targets = [
        str(PROJECT / "pwned-by-candidate.txt"),
        str(protected),
        "/tmp/pwned-by-candidate.txt",
        "/var/tmp/pwned-by-candidate.txt",
        "/dev/shm/pwned-by-candidate.txt",
        str(tmp_path / "pwned.txt"),
    ]
    code = """
        import os
        def f(targets):
            wrote = []
            for target in targets:
                try:
                    with open(target, "a") as handle:
                        handle.write("pwned")
                    wrote.append(target)
                except OSError:
                    pass
            with open("scratch.txt", "w") as handle:  # its own folder is writable
                handle.write("fine")
            return [wrote, os.getcwd()]
        """
    outcome = run(sandbox, code, targets)
    assert outcome.status == "ok", outcome.reason
    for target in targets:
        assert not os.path.exists(target) or target == str(protected), target
    assert hashlib.sha256(protected.read_bytes()).hexdigest() == before
    assert not os.path.exists(os.path.join(outcome.value[1], "scratch.txt"))


def test_cannot_kill_the_harness_or_the_workers(sandbox: Sandbox) -> None:
    # without a pid namespace kill(-1) could reach the harness's own user's processes
    _isolated(run(sandbox, "def f(): return 1"), "pid-namespace")
    workers = sandbox._pids()
    code = """
        import os, signal
        def f(pids):
            for pid in [os.getppid(), 0, -1, 1, *pids]:
                for number in (signal.SIGKILL, signal.SIGTERM):
                    try:
                        os.kill(pid, number)
                    except OSError:
                        pass
            return "tried"
        """
    outcome = run(sandbox, code, [os.getpid(), os.getppid(), *workers])
    assert outcome.status == "ok"  # the candidate cannot even kill itself as a namespace's pid 1
    assert all(_alive(pid) for pid in workers)
    assert sandbox._pids() == workers
    assert run(sandbox, "def f(): return 2").value == 2


@needs_isolation(ROOT, "the uid switch happens only when the harness is root")
def test_runs_as_an_unprivileged_uid(sandbox: Sandbox) -> None:
    outcome = run(sandbox, "import os\ndef f(): return [os.getuid(), os.geteuid(), os.getgroups()]")
    uid = outcome.value[0]
    assert UID_FIRST <= uid < UID_FIRST + UID_COUNT
    assert outcome.value == [uid, uid, []]
    assert f"uid={uid}" in outcome.isolation


# --- the workers themselves ----------------------------------------------------------------


def test_a_killed_zygote_is_restarted() -> None:
    with Sandbox(workers=1) as single:
        assert run(single, "def f(): return 1").value == 1
        launcher, zygote_pid = single._pids()
        os.kill(zygote_pid, signal.SIGKILL)
        assert run(single, "def f(): return 2").value == 2
        assert zygote_pid not in single._pids()
        # killed in the middle of an evaluation: an error outcome, then a fresh worker
        timer = threading.Timer(0.3, lambda: os.kill(single._pids()[1], signal.SIGKILL))
        timer.start()
        outcome = run(single, "import time\ndef f(): time.sleep(30)", wall_seconds=10)
        timer.join()
        assert outcome.status == "error"
        assert "the sandbox worker died during the evaluation" in outcome.reason
        assert run(single, "def f(): return 3").value == 3


def test_close_leaves_no_process() -> None:
    single = Sandbox(workers=2)
    assert run(single, "def f(): return 1").value == 1
    pids = single._pids()
    outcomes: list[Outcome] = []
    code = "import os\ndef f(): os.execv('/bin/sleep', ['sleep', '876.543'])"
    thread = threading.Thread(target=lambda: outcomes.append(single.run(code, "f")))
    thread.start()
    deadline = time.monotonic() + 10
    while not _processes_with("876.543") and time.monotonic() < deadline:
        time.sleep(0.01)
    single.close()
    single.close()  # idempotent
    thread.join()
    assert outcomes[0].reason == "the sandbox was closed during the evaluation"
    assert not any(_alive(pid) for pid in pids)
    assert _processes_with("876.543") == []
    with pytest.raises(RuntimeError, match="closed"):
        single.run("def f(): return 1", "f")


@needs_isolation(ROOT, "needs root to start the harness as another user")
def test_works_for_a_user_without_privileges(tmp_path: Path) -> None:
    """Not root: a user namespace stands in for the uid switch."""
    python = python_for_nobody()
    if python is None:
        missing_isolation("no Python here that an unprivileged user may run")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(PROJECT)!r})
        from harness.evaluation.sandbox import Sandbox
        with Sandbox(workers=1, preload=()) as sandbox:
            outcome = sandbox.run("import os\\ndef f(): return [os.getpid(), os.getuid()]", "f")
        print(outcome.status, outcome.value, sorted(outcome.isolation), outcome.warnings)
        """
    )
    result = as_nobody([python, "-c", script])
    assert result.returncode == 0, result.stderr
    if "user-namespace" not in result.stdout:
        missing_isolation(f"user namespaces are not allowed here: {result.stdout}")
    assert result.stdout.startswith("ok [1, 65534]")
    kinds = (
        "net-namespace",
        "pid-namespace",
        "mount-namespace",
        "minimal-root",
        "read-only-filesystem",
        "seccomp",
    )
    for kind in kinds:
        assert kind in result.stdout
    assert "control groups need root" in result.stdout  # said, not silently missing


@needs_isolation(ROOT, "needs root to start the harness as another user")
def test_private_paths_are_hidden_from_a_user_without_privileges_too() -> None:
    """The user-namespace path builds the same root of its own: the problems' data are out of
    the candidate's sight whether the sandbox names them private or not (the checkout is no
    folder of this interpreter's), and a call's own private paths cover what the root does show
    (a file of the standard library, readable to the call beside it)."""
    python = python_for_nobody()
    if python is None:
        missing_isolation("no Python here that an unprivileged user may run")
    data = PROJECT / "problems" / "equation_discovery" / "data" / "oscillator1.npz"
    script = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(PROJECT)!r})
        from harness.evaluation.sandbox import Sandbox
        code = (
            "def f(path):\\n    try:\\n        return len(open(path, 'rb').read())\\n"
            "    except OSError as exc:\\n        return type(exc).__name__\\n"
        )
        shown = os.path.realpath(os.__file__)
        outcomes = []
        with Sandbox(workers=1, preload=()) as sandbox:
            outcomes.append(sandbox.run(code, "f", ({str(data)!r},)))
            outcomes.append(sandbox.run(code, "f", (shown,)))
            outcomes.append(sandbox.run(code, "f", (shown,), None, (shown,)))
        with Sandbox(workers=1, preload=(), private_paths=()) as sandbox:
            outcomes.append(sandbox.run(code, "f", ({str(data)!r},)))
        described = [[o.value, o.isolation, o.warnings] for o in outcomes]
        print(json.dumps([os.path.getsize(shown), *described]))
        """
    )
    result = as_nobody([python, "-c", script])
    assert result.returncode == 0, result.stderr
    size, (hidden, isolation, warnings), (shown, _, _), (per_call, _, _), (unnamed, more, _) = (
        json.loads(result.stdout)
    )
    if "user-namespace" not in isolation:
        missing_isolation(f"user namespaces are not allowed here: {warnings}")
    assert {"private-paths-hidden", "minimal-root"} <= set(isolation)
    assert "minimal-root" in more
    assert hidden == unnamed == "FileNotFoundError"
    assert shown == size > 0
    assert per_call == 0  # covered with /dev/null


# --- the data format, without processes ----------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_arrays = hnp.arrays(
    dtype=hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="=")
    | hnp.unsigned_integer_dtypes(endianness="=")
    | hnp.floating_dtypes(endianness="=")
    | hnp.complex_number_dtypes(endianness="="),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)
_data = st.recursive(
    _scalars | _arrays,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=6).filter(lambda k: not k.startswith("__")), inner, max_size=4
        )
    ),
    max_leaves=12,
)


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@given(_data)
def test_codec_round_trips(value: object) -> None:
    wire = json.loads(json.dumps(zygote.encode(value), allow_nan=True))
    assert _same(value, zygote.decode(wire))


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ({"__ndarray__": ["|O", [1], "AAAAAAAAAAA="]}, "unsupported dtype '|O'"),
        ({"__ndarray__": ["<f8", [2], "AAAAAAAAAAA="]}, "8 bytes do not fit shape (2,)"),
        ({"__ndarray__": ["<f8", [-1], ""]}, "malformed shape"),
        ({"__ndarray__": ["<f8", [1], "!!!!"]}, "not base64"),
        ({"__ndarray__": ["f8,i4", [1], ""]}, "unsupported dtype"),
        ({"__ndarray__": ["<f8", [1], "AAAAAAAAAAA="], "x": 1}, "beside other keys"),
        ({"__reduce__": "os.system"}, "unknown marker '__reduce__'"),
        ({"__complex__": ["1", 2]}, "malformed complex"),
    ],
)
def test_decode_is_strict(wire: object, message: str) -> None:
    with pytest.raises(zygote.CodecError, match=re.escape(message)):
        zygote.decode(wire)


def test_an_array_where_numpy_does_not_import_is_a_codec_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox whose interpreter cannot import numpy (a venv that does not match the tree)
    once failed every evaluation with a bare exit status: the decoder must name the cause."""
    wire = json.loads(json.dumps(zygote.encode({"x": np.zeros(2)})))
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` now raises ImportError
    cause = re.escape("an array at ['x'], but numpy does not import here")
    with pytest.raises(zygote.CodecError, match=cause):
        zygote.decode(wire)


def test_nesting_is_bounded() -> None:
    deep: list = []
    for _ in range(zygote.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(zygote.CodecError, match="nested deeper"):
        zygote.decode(deep)
    with pytest.raises(zygote.CodecError, match="nested deeper"):
        zygote.encode(deep)
