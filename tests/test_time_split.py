"""Where a campaign's time goes: each batch's stages recorded as it is stored, added up by
`vpo status` and the progress line (harness/observation/ledger.py,
harness/observation/time_split.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import Replay
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.config.settings import build
from harness.evaluation.sandbox import Sandbox
from harness.evolution.loop import run_campaign
from harness.observation.ledger import Ledger, LoopClock, batch_payload
from harness.observation.time_split import BESIDE_STAGES, EVENT, LOOP_STAGES, split
from harness.store import Store
from problems.equation_discovery import EquationDiscovery

OSCILLATOR = EquationDiscovery("oscillator1")
EXPRESSIONS = [
    "params[0] * x",
    "params[0] * x + params[1] * v",
    "params[0] * np.sin(x) + params[1] * v",
    "params[0] * x ** 3 + params[1] * v",
    "params[0] * x * v + params[1]",
    "params[0] * np.cos(x) * v",
    "params[0] * v ** 3 + params[1] * x",
    "params[0] * np.sin(x) + params[1] * v ** 3",
]


def _completion(i: int) -> str:
    chosen = [EXPRESSIONS[(i + k) % len(EXPRESSIONS)] for k in range(3)]
    chosen[2] = f"{chosen[2]} + params[2] * x ** {i % 5 + 2}"  # each rollout writes something new
    return "".join(f"<candidate_{k}>\n{e}\n</candidate_{k}>\n" for k, e in enumerate(chosen, 1))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Four iterations of oscillator1 in two batches of two, through the real loop, sandbox and
    fits; the progress lines it printed."""
    path = tmp_path_factory.mktemp("time") / "c.db"
    config = build(
        {
            "problem": OSCILLATOR.name,
            "group_size": 2,
            "candidates": 3,
            "iterations": 4,
            "concurrency": 2,
            "workers": 2,
            "form": "compact",
        }
    )
    lines: list[str] = []
    with Store.open(path) as store:
        run_campaign(
            config,
            store,
            OSCILLATOR,
            generator=Replay([_completion(i) for i in range(8)]),
            on_progress=lambda done, progress: lines.append(progress.line(done, 4)),
        )
    return path, lines


def test_each_batch_records_its_stages_once_stored(campaign: tuple[Path, list[str]]) -> None:
    path, _ = campaign
    with Store.open(path) as store:
        (record,) = store.campaigns()
        events = [e.payload for e in store.events(record.id, EVENT)]
    # Two batches, then the period after the last one (its wait: no batch of its own).
    assert [e["iterations"] for e in events] == [[0, 1], [2, 3], []]
    for payload in events[:2]:
        assert {"selecting", "generating"} <= set(payload["loop"]) <= set(LOOP_STAGES)
        assert set(payload["beside"]) == set(BESIDE_STAGES)
        # The loop's stages follow one another inside its period.
        assert sum(s for s, _ in payload["loop"].values()) <= payload["wall"] + 1e-3
        assert payload["tokens"] == 2 * 2 * 3  # G = 2 rollouts of 3 tokens, two iterations
    assert "waiting" in events[1]["loop"]  # the second batch waited for the first's storage
    # The fits ran in the sandbox's processes: their CPU time is the evaluating stage's.
    assert sum(e["beside"]["evaluating"][1] for e in events[:2]) > 0


def test_status_and_the_progress_line_show_the_split(
    campaign: tuple[Path, list[str]], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, lines = campaign
    assert all("| time: " in line for line in lines)  # a batch's loop stages end before it stores
    # The scripted model answers at once: the loop waits for the fits.
    assert "waiting" in lines[-1]
    evaluating = lines[-1].split("beside: ")[1].split("evaluating ")[1]
    assert 0 < int(evaluating.split("%")[0]) <= 100  # the batch before ended in this wall
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["status", "--db", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "time (last 2 batches)" in printed
    assert main(["status", "--db", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    timing = report["time_split"]
    assert timing["batches"] == 2
    assert list(timing["loop"])[:2] == ["selecting", "generating"]
    assert list(timing["beside"]) == list(BESIDE_STAGES)
    shares = [stage["share"] for stage in timing["loop"].values()]
    assert sum(shares) + timing["other_share"] == pytest.approx(1.0, abs=1e-3)


def test_the_newest_payloads_come_oldest_first(db_url: str) -> None:
    with Store.open(db_url) as store:
        campaign_id = store.create_campaign("c", "toy", {}, 0)
        for k in range(5):
            store.record_event(campaign_id, EVENT, batch_payload([k], k, 1.0, {}, {}))
            store.record_event(campaign_id, "other", {"k": k})
        found = store.recent_payloads(campaign_id, EVENT, 3)
    assert [p["iterations"] for p in found] == [[2], [3], [4]]


def test_a_stage_counts_its_wall_and_the_cpu_it_used() -> None:
    ledger = Ledger()
    with ledger.stage("sleeping"):
        time.sleep(0.05)
    with ledger.stage("working"):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
    stages = ledger.take()
    assert stages["sleeping"][0] >= 0.05 and stages["sleeping"][1] < stages["sleeping"][0]
    assert stages["working"][1] >= 0.05
    assert ledger.take() == {}  # taken: the next batch starts afresh


def test_the_loop_clock_leaves_the_evaluation_threads_cpu_out() -> None:
    """CPU burnt on the watched thread during a loop stage is not the loop's."""
    import threading

    clock = LoopClock()
    burnt, release = threading.Event(), threading.Event()

    def burn() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        burnt.set()
        release.wait()  # alive, as the evaluation thread is while the loop runs

    worker = threading.Thread(target=burn)
    worker.start()
    clock.watch(worker.ident)
    with clock.stage("waiting"):
        burnt.wait()
    release.set()
    worker.join()
    _, stages = clock.period()
    seconds, cpu = stages["waiting"]
    assert cpu < 0.1 < seconds


def test_the_sandbox_counts_its_candidates_cpu() -> None:
    code = "def f():\n    t = 0\n    for i in range(3_000_000):\n        t += i\n    return t\n"
    with Sandbox(workers=1) as sandbox:
        outcome = sandbox.run(code, "f")
        assert outcome.status == "ok" and outcome.cpu_seconds > 0
        assert sandbox.cpu_seconds == pytest.approx(outcome.cpu_seconds)


PAIR = st.tuples(st.floats(0, 1e4), st.floats(0, 1e4))


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "iterations": st.lists(st.integers(0, 100), max_size=3),
                "tokens": st.integers(0, 10**6),
                "wall": st.floats(0, 1e5),
                "loop": st.dictionaries(st.sampled_from(LOOP_STAGES), PAIR),
                "beside": st.dictionaries(st.sampled_from(BESIDE_STAGES), PAIR),
            }
        ),
        max_size=6,
    )
)
def test_the_split_adds_batches_up(payloads: list[dict]) -> None:
    total = split(payloads)
    assert total.wall == pytest.approx(sum(p["wall"] for p in payloads))
    assert total.batches == sum(bool(p["iterations"]) for p in payloads)
    for name in LOOP_STAGES:
        expected = sum(p["loop"][name][0] for p in payloads if name in p["loop"])
        assert total.loop.get(name, [0.0])[0] == pytest.approx(expected)
    report = total.as_json()  # never raises, whatever the numbers
    assert isinstance(report["line"], str)


@pytest.mark.parametrize(
    "payload",
    [
        {"wall": "soon", "loop": {}},
        {"wall": 3, "loop": {"generating": "fast"}, "beside": [1, 2]},
        {"wall": 3, "loop": {"generating": [1]}, "tokens": None},
        {"iterations": [1], "wall": 2, "loop": {"generating": [1, None]}},
    ],
)
def test_a_payload_of_another_shape_adds_what_it_can(payload: dict) -> None:
    total = split([payload, batch_payload([0], 10, 2.0, {"generating": [1.0, 2.0]}, {})])
    assert total.loop["generating"][0] >= 1.0
    assert total.as_json()["loop"]["generating"]["cores"] is not None
