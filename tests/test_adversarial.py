"""Adversarial volume: 1,000 hostile completions (garbage, giant, truncated or nested tags, code
that attacks the sandbox) through the whole loop (parse, evaluate in the sandbox, store): no
crash, each recorded with its reason, memory and open files flat.

The completions are scripted: no model writes attacks on demand, so a generator that replays
them stands in for one. Everything after it is the real campaign loop."""

from __future__ import annotations

import os
import random
from pathlib import Path

from conftest import Replay
from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.config.settings import build
from harness.evolution.loop import run_campaign
from harness.store import Store
from harness.store.models import Program, Trajectory
from problems.registry import load as load_problem

GROUP, ITERATIONS = 10, 100  # 1,000 completions

PROBLEM = """
from problems.api import Objective, Problem


class Answer(Problem):
    name = "answer"
    description = "Return a number close to 1."
    seed_program = "def answer():\\n    return 0.5\\n"
    entry = "answer"
    time_limit = 1.0
    memory_mb = 256
    objectives = (Objective("value", "max", 1.0, "test"),)

    def score(self, call, value):
        return {"value": min(1.0, max(0.0, float(value)))}


problem = Answer()
"""

ATTACKS = [
    "while True:\n    pass",
    "import os\nwhile True:\n    os.fork()",
    "x = bytearray(10 ** 10)",
    "x = [0] * (10 ** 9)",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import os\nos._exit(0)",
    "raise SystemExit(3)",
    "raise KeyboardInterrupt",
    "import sys\nsys.setrecursionlimit(10 ** 6)\ndef f(n):\n    return f(n + 1)\nf(0)",
    "import ctypes\nctypes.string_at(0)",
    "print('x' * 10 ** 8)",
    "open('/tmp/vpo-pwned', 'w').write('x')\nopen('/etc/shadow').read()",
    "import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=1)",
    "import threading\nfor _ in range(10000):\n    threading.Thread(target=lambda: None).start()",
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
    "def g():\n    yield 1",
    # issue 13's classes: text that cannot be stored, forged result bytes, memory RLIMIT_AS does
    # not see, system calls past the candidate's own process
    "raise ValueError('lone \\ud800 surrogate')",
    "import os\nos.write(1, b'\\xed\\xa0\\x80')\nos.write(3, b'{\"value\": "
    '{"__ndarray__": ["<f8", [0, 4611686018427387904], ""]}}\')\nos._exit(0)',
    "import os\nos.write(3, b'{\"value\": {\"__complex__\": [1' + b'0' * 400 + b', 0]}}')"
    "\nos._exit(0)",
    "import os\nfds = [os.memfd_create('x') for _ in range(20)]\n"
    "for fd in fds:\n    os.ftruncate(fd, 60 << 20)\n    os.pwrite(fd, b'x' * (60 << 20), 0)",
    "import ctypes\nctypes.CDLL(None).unshare(0x10000000)",
]


def hostile(rng: random.Random, index: int) -> str:
    kind = index % 10
    if kind == 0:
        return ""
    if kind == 1:  # some with a lone surrogate, as a JSON endpoint can return
        text = "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 3000)))
        return text + ("\ud800<candidate_1>\udfff" if index % 20 == 1 else "")
    if kind == 2:
        return "<candidate_1>\n```python\n" + "A" * 300_000
    if kind == 3:
        return "<candidate_1>\n```python\ndef answer(" + "(" * rng.randrange(1, 500)
    if kind == 4:
        return "<candidate_1><candidate_1><candidate_2>x</candidate_2></candidate_1>" * 50
    if kind == 5:
        return "".join(f"<candidate_{rng.randrange(-5, 9)}>" for _ in range(5000))
    if kind == 6:
        return "<candidate_1>\n```python\ndef answer():\n    return 1\x00\n```\n</candidate_1>"
    if kind == 7:
        return "<<<<<<< SEARCH\n" + "nothing like this\n" * 100 + "=======\n>>>>>>> REPLACE\n"
    # kinds 8 and 9: an attack on the sandbox, in a well-formed answer
    attack = ATTACKS[(index // 10) % len(ATTACKS)]
    body = f"{attack}\n\ndef answer():\n    return 1.0 if {index} % 3 else g()"
    return f"<candidate_1>\n```python\n{body}\n```\n</candidate_1>"


def _rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_thousand_hostile_completions(tmp_path: Path) -> None:
    folder = tmp_path / "answer"
    folder.mkdir()
    (folder / "problem.py").write_text(PROBLEM)
    problem = load_problem(str(folder))
    rng = random.Random(1000)
    texts = [hostile(rng, i) for i in range(GROUP * ITERATIONS)]
    config = build(
        {
            "problem": str(folder),
            "group_size": GROUP,
            "candidates": 2,
            "iterations": ITERATIONS,
            "workers": 2,
        }
    )
    store = Store.open(tmp_path / "hostile.db")
    samples: dict[int, tuple[float, int]] = {}

    def measure(iteration: int, _progress: object) -> None:
        samples[iteration] = (_rss_mb(), len(os.listdir("/proc/self/fd")))

    campaign_id = run_campaign(config, store, problem, generator=Replay(texts), on_progress=measure)

    assert store.get_campaign(problem.name).status == "finished"
    with Session(store.engine) as session:
        trajectories = session.scalars(select(Trajectory)).all()
        programs = session.scalars(
            select(Program).where(Program.campaign_id == campaign_id, Program.origin == "llm")
        ).all()
    assert len(trajectories) == GROUP * ITERATIONS
    for trajectory in trajectories:  # every slot says what happened to it
        for slot in trajectory.candidates:
            assert slot["outcome"] in ("new", "duplicate", "unparsed")
            if slot["outcome"] == "unparsed":
                assert slot["reason"] and "\n" not in slot["reason"]
        if trajectory.parse_status != "ok":
            assert trajectory.parse_error
    failed = [p for p in programs if p.status != "ok"]
    assert len(failed) >= len(ATTACKS)  # the attacks ran, and failed
    assert all(p.error for p in failed)
    reasons = " | ".join(p.error for p in failed)
    for words in ("\ufffd surrogate", "cannot accept", "seccomp"):
        assert words in reasons, words
    if os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup/memory"):
        assert "memory limit exceeded" in reasons
    assert not Path("/tmp/vpo-pwned").exists() or Path("/tmp/vpo-pwned").stat().st_size == 0
    # Memory and open files flat after warm-up: a quarter of the way in vs the end.
    early = samples[ITERATIONS // 4]
    late = samples[ITERATIONS]
    assert late[0] - early[0] < 64, samples
    assert late[1] <= early[1] + 4, samples
