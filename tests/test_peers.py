"""benchmarks/peers.py: the proxy that counts, evens out and cuts every harness's model calls; the
peers' records read back from the project's scorer; and each harness run end to end, for a
few model calls, against a scripted OpenAI-compatible server instead of a model.

The end-to-end tests install OpenEvolve and ShinkaEvolve into their environments under /tmp on
first use (pip, a minute or two); a peer that cannot be installed fails its test with pip's
reason: it is never skipped.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from chat_server import chat_server

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peers.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_peers", SCRIPT)
assert _SPEC is not None and _SPEC.loader is not None
peers = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = peers
_SPEC.loader.exec_module(peers)  # puts benchmarks/ and benchmarks/peers/ on sys.path

import peer_results  # noqa: E402
from peer_harnesses import (  # noqa: E402
    PEERS,
    PeerInstallError,
    marked_seed,
    peer_python,
    vpo_launch,
)
from peer_proxy import Ledger, Sampling, proxy, read_calls  # noqa: E402
from peer_results import PeerRun, peer_programs, read_scores  # noqa: E402

TOKENS_PER_ANSWER = 50
OBJECTIVES = ["fit_id", "fit_ood", "simplicity"]
SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_tokens=300)

# What the scripted model writes, in turn; the last names what no equation has, so the
# project's scorer refuses it before it runs (the grammar) and not every proposal is valid.
FORMS = (
    "params[0] * {a} + params[1] * {b} ** 3 + params[2]",
    "params[0] * np.sin({a}) + params[1] * {b}",
    "params[0] * {a} * {b} + params[1] * {a} + params[2]",
    "params[0] * no_such_name",
)


class ScriptedModel:
    """An OpenAI-compatible answer in the format each harness asks for: vpo's <candidate_i>
    tags, OpenEvolve's and Shinka's whole programs, else a SEARCH/REPLACE edit of the `equation`
    line (OpenEvolve's and Shinka's diffs). It records every request body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._forms = itertools.cycle(FORMS)
        self._lock = threading.Lock()

    def expression(self, inputs: list[str]) -> str:
        with self._lock:
            return next(self._forms).format(a=inputs[0], b=inputs[-1])

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        text = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
        if "add_generation_prompt" in body:  # vLLM's /tokenize, which vpo asks first
            return {"count": len(text) // 4}
        self.bodies.append(body)
        n = int(body.get("n") or 1)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": self.answer(text)},
             "finish_reason": "stop"}
            for i in range(n)
        ]  # fmt: skip
        usage = {"prompt_tokens": len(text) // 4, "completion_tokens": TOKENS_PER_ANSWER * n}
        return {"choices": choices, "usage": usage}

    def answer(self, text: str) -> str:
        signature = re.search(r"def equation\(([^)]*)\)", text)
        names = (
            [p.split(":")[0].strip() for p in signature.group(1).split(",")] if signature else []
        )
        inputs = [name for name in names if name != "params"] or ["x"]
        line = re.search(r"^def equation\(.*\):$", text, re.M)
        header = line.group(0) if line else f"def equation({', '.join([*inputs, 'params'])}):"
        if "<candidate_" in text:
            m = int(re.search(r"i = 1\.\.(\d+)", text).group(1))  # type: ignore[union-attr]
            return "".join(
                f"<candidate_{i}>\n{self.expression(inputs)}\n</candidate_{i}>\n"
                for i in range(1, m + 1)
            )
        program = (  # a whole program, for the harnesses that ask for one
            "import numpy as np\n\n\n# EVOLVE-BLOCK-START\n{header}\n"
            "    return {expression}\n# EVOLVE-BLOCK-END\n"
        )
        if "Provide the complete new program code" in text:  # OpenEvolve without diffs
            program = program.format(header=header, expression=self.expression(inputs))
            return f"A rewrite.\n```python\n{program}```\n"
        if "<CODE>" in text:
            program = program.format(header=header, expression=self.expression(inputs))
            return f"<NAME>\nscripted\n</NAME>\n<DESCRIPTION>\nA rewrite.\n</DESCRIPTION>\n" \
                   f"<CODE>\n```python\n{program}```\n</CODE>\n"  # fmt: skip
        # a diff: the current program's return line for a new one (code left after a return
        # is not straight-line, and the project's grammar refuses it)
        returned = re.search(r"^    return .*$", text[line.end() :] if line else text, re.M)
        search = returned.group(0) if returned else "    return"
        return (
            "<NAME>\nscripted\n</NAME>\n<DESCRIPTION>\nAn edit.\n</DESCRIPTION>\n<DIFF>\n"
            f"<<<<<<< SEARCH\n{search}\n=======\n"
            f"    return {self.expression(inputs)}\n>>>>>>> REPLACE\n</DIFF>\n"
        )


# The proxy


def test_the_proxy_evens_out_sampling_counts_tokens_and_cuts_at_the_budget(tmp_path: Path) -> None:
    model = ScriptedModel()
    ledger = Ledger(budget=2 * TOKENS_PER_ANSWER, log=tmp_path / "calls.jsonl")
    asked = {
        "model": "m", "messages": [{"role": "user", "content": "def equation(x, v, params):"}],
        "temperature": 0.1, "top_p": 0.5, "max_tokens": 9, "max_completion_tokens": 9, "seed": 7,
    }  # fmt: skip
    with chat_server(model) as upstream, proxy(upstream, ledger, SAMPLING) as url:
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "m"  # passed through
        for _ in range(2):
            assert httpx.post(f"{url}/chat/completions", json=asked).status_code == 200
        refused = httpx.post(f"{url}/chat/completions", json=asked)
        streamed = httpx.post(f"{url}/chat/completions", json=asked | {"stream": True})
    assert refused.status_code == 400
    assert "token budget spent: 100 of 100" in refused.json()["error"]["message"]
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
    assert len(model.bodies) == 2  # neither the refused request nor the streamed one went on
    for body in model.bodies:
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.8, 0.95, 300)
        assert "seed" not in body and "max_completion_tokens" not in body
    assert (ledger.spent, ledger.calls, ledger.refused, ledger.in_flight) == (100, 2, 1, 0)
    calls = read_calls(tmp_path / "calls.jsonl")
    assert [c["spent"] for c in calls] == [50, 100] and all(c["status"] == 200 for c in calls)
    assert all(c["start"] <= c["end"] for c in calls)
    exchanges = [json.loads(line) for line in (tmp_path / "exchanges.jsonl").open()]
    assert [e["messages"] for e in exchanges] == [asked["messages"]] * 2
    assert all(len(e["answers"]) == 1 and e["answers"][0] for e in exchanges)


def test_a_peers_programs_sit_on_the_tokens_axis_where_their_evaluation_started() -> None:
    calls = [
        {"end": 10.0, "status": 200, "spent": 40},
        {"end": 11.0, "status": 400, "spent": 40},  # the server failed it: no tokens
        {"end": 20.0, "status": 200, "spent": 90},
    ]
    zero = {"fit": 0.0, "combined_score": 0.0}
    scores = [
        {"event": "start", "id": "seed", "t": 1.0},
        {"event": "end", "id": "seed", "t": 2.0, "status": "ok", "scores": {"fit": 0.1}},
        {"event": "start", "id": "a", "t": 12.0},
        {"event": "start", "id": "b", "t": 21.0},
        {"event": "end", "id": "b", "t": 23.0, "status": "invalid", "scores": zero},
        {"event": "end", "id": "a", "t": 22.0, "status": "ok", "scores": {"fit": 0.4}},
    ]
    tokens, vectors, valid = peer_programs(calls, scores, ["fit"])
    assert tokens.tolist() == [0, 40] and vectors.tolist() == [[0.1], [0.4]]
    assert valid == 1  # the seed's evaluation is no proposal


@pytest.mark.parametrize("valid", [2, 0])
def test_a_kept_run_gives_back_the_run_it_was_written_from(valid: int, tmp_path: Path) -> None:
    """--resume and --report-from read run.json instead of running again: the same arrays,
    with their shape kept for a run that proposed no valid program."""
    scores = np.array([[0.1, 0.0, 0.0], [0.3, 0.2, 0.5]])[:valid]
    run = PeerRun(
        "shinka", "equation_discovery:oscillator1", 2, ["fit_id", "fit_ood", "simplicity"],
        8000, np.array([0, 4100], dtype=np.int64)[:valid], scores, 9, valid, 8120, 9, 1, 401.5,
        "def equation(x, v, params): ...", {"fit_id": 0.3}, "ok",
    )  # fmt: skip
    run.save(tmp_path / "run.json")
    back = PeerRun.load(tmp_path / "run.json")
    assert back.program_tokens.dtype == np.int64 and back.program_scores.shape == (valid, 3)
    np.testing.assert_array_equal(back.program_scores, scores)
    assert (back.tokens, back.refused, back.rescored, back.cut) == (8120, 1, {"fit_id": 0.3}, True)
    assert np.isnan(back.best()).all() if valid == 0 else back.best().tolist() == [0.3, 0.2, 0.5]


def test_a_report_from_kept_runs_says_which_seeds_each_harness_ran(tmp_path: Path) -> None:
    """Runs kept over several sessions, some harnesses on fewer seeds: the table goes in the
    harnesses' order (not the folders'), counts each harness's seeds, and the header names the
    seeds and budget that were run, not the command line's defaults."""
    for harness, seeds in (("openevolve-full", (0, 1)), ("openevolve", (0,)), ("vpo", (1, 0))):
        for seed in seeds:
            scores = np.array([[0.1 + seed, 0.0, 0.0]])
            folder = tmp_path / "runs" / f"{harness}-seed{seed}"
            folder.mkdir(parents=True)
            PeerRun(
                harness, "equation_discovery:oscillator1", seed, OBJECTIVES, 6000,
                np.array([0], dtype=np.int64), scores, 4, 1, 6100, 4, 1, 60.0, None, None, None,
            ).save(folder / "run.json")  # fmt: skip
    out = tmp_path / "peers.md"
    peers.main(["--report-from", str(tmp_path / "runs"), "--out", str(out),
                "--plot", str(tmp_path / "peers.png")])  # fmt: skip
    table = out.read_text()
    assert "budget: 6000 completion tokens per run; seeds 0, 1" in table
    rows = [line for line in table.splitlines() if line.startswith("| OpenEvolve") or
            line.startswith("| vpo-evolve")]  # fmt: skip
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| OpenEvolve 0.4.0", "1"], ["| OpenEvolve 0.4.0, whole programs", "2"],
        ["| vpo-evolve, no training", "2"],
    ]  # fmt: skip
    assert " | 0.600 [0.100, 1.100] | " in rows[2]  # the mean over its two seeds


def test_the_hypervolume_is_over_what_the_seed_scores_on() -> None:
    """One run that opens a gated objective (simplicity) the seed scores 0 on must not make
    every other run's hypervolume 0: it counts the objectives the seed program scores on."""
    seed = [0.14, 0.017, 0.0]

    def run(harness: str, *better: list[float]) -> PeerRun:
        scores = np.array([seed, *better])
        tokens = np.arange(len(scores), dtype=np.int64) * 100  # the seed at 0 tokens
        return PeerRun(
            harness, "equation_discovery:oscillator1", 0, OBJECTIVES, 8000, tokens, scores,
            10, len(scores), 8000, 10, 0, 1.0, None, None, None,
        )  # fmt: skip

    runs = [run("shinka"), run("vpo", [0.3, 0.08, 0.5]), run("vpo-train", [0.14, 0.1, 0.0])]
    assert peer_results.live_objectives(runs) == [0, 1]
    volumes = [r.hypervolume([0, 1]) for r in runs]
    assert volumes[0] == pytest.approx(0.14 * 0.017)
    assert volumes[1] == pytest.approx(0.3 * 0.08) and volumes[2] == pytest.approx(0.14 * 0.1)


def test_the_seed_is_marked_around_the_evolved_function() -> None:
    from problems.registry import load

    problem = load("equation_discovery:bactgrow")
    marked = marked_seed(problem.seed_program, problem.entry)
    lines = marked.splitlines()
    start, end = lines.index("# EVOLVE-BLOCK-START"), lines.index("# EVOLVE-BLOCK-END")
    assert lines[start + 1].startswith("def equation(b, s, temp, pH, params)")
    assert "import numpy as np" in lines[:start] and lines[end - 1].strip().startswith("return")
    assert marked.replace("# EVOLVE-BLOCK-START\n", "").replace("# EVOLVE-BLOCK-END\n", "") == (
        problem.seed_program
    )


def test_vpo_runs_demo_settings_at_the_shared_sampling_and_trains_only_in_vpo_train(
    tmp_path: Path,
) -> None:
    untrained, trained = (
        vpo_launch(arm, "equation_discovery:oscillator1", 2, "http://127.0.0.1:1/v1", "m",
                   SAMPLING, 4000, tmp_path).command
        for arm in ("vpo", "vpo-train")
    )  # fmt: skip
    for command in (untrained, trained):
        flags = dict(zip(command[5::2], command[6::2], strict=False))
        assert flags["--config"].endswith("examples/demo.toml") and flags["--seed"] == "2"
        assert (flags["--backend"], flags["--base-url"], flags["--token-budget"]) == (
            "openai",
            "http://127.0.0.1:1/v1",
            "4000",
        )
        assert (flags["--temperature"], flags["--top-p"], flags["--max-tokens"]) == (
            "0.8",
            "0.95",
            "300",
        )
    assert untrained[-2:] == ["--train-every", "0"] and "--train-every" not in trained
    assert trained[-2:] == ["--gradient-checkpointing", "on"]  # long answers fit beside a server


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--harnesses", "openevolve,alphaevolve"], "--harnesses takes some of"),
        (["--token-budget", "0"], "--token-budget must be > 0"),
        (["--token-budget", "-5"], "--token-budget must be > 0"),
        (["--problems", "oscillator9"], "unknown equation_discovery problem 'oscillator9'"),
        (["--problems", "no_such_problem:1"], "unknown problem 'no_such_problem'"),
        (["--resume"], "--resume goes on with the runs kept in --keep DIR"),
    ],
)
def test_bad_command_lines_are_one_line_errors(flags: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--base-url", "http://127.0.0.1:9/v1", *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr
    assert "Traceback" not in done.stderr


# Each harness end to end


def installed(harness: str) -> None:
    """Install the peer's environment now, so that its test fails with pip's reason."""
    if harness in PEERS:
        try:
            peer_python(PEERS[harness], say=lambda _: None)
        except PeerInstallError as error:
            pytest.fail(f"{harness} cannot be installed from PyPI here: {error}", pytrace=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness", ["openevolve", "openevolve-full", "shinka", "vpo"])
def test_each_harness_runs_to_the_budget_through_the_proxy(harness: str, tmp_path: Path) -> None:
    installed(harness)
    budget = 5 * TOKENS_PER_ANSWER
    model = ScriptedModel()
    out, picture, kept = tmp_path / "peers.md", tmp_path / "peers.png", tmp_path / "runs"
    with chat_server(model) as url:
        done = subprocess.run(  # --keep relative, as typed in the documented command
            [sys.executable, str(SCRIPT), "--harnesses", harness, "--problems", "oscillator1",
             "--seeds", "0", "--token-budget", str(budget), "--base-url", url, "--model", "m",
             "--max-tokens", "300", "--keep", "runs", "--out", str(out), "--plot", str(picture)],
            capture_output=True, text=True, timeout=840, cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    folder = kept / f"equation_discovery-oscillator1-{harness}-seed0"
    run = PeerRun.load(folder / "run.json")

    # The proxy counted every answered call and its tokens, and the budget ended the run.
    calls = [c for c in read_calls(folder / "calls.jsonl") if c["status"] == 200]
    assert run.calls == len(calls) >= 1 and run.tokens == calls[-1]["spent"]
    assert run.tokens == sum(c["completion_tokens"] for c in calls) >= budget
    assert len(model.bodies) == run.calls  # nothing reached the model but through the proxy
    for body in model.bodies:
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.8, 0.95, 300)
        assert "seed" not in body
    whole = ["Provide the complete new program code" in str(b["messages"]) for b in model.bodies]
    if harness.startswith("openevolve"):  # diffs in the example's setting, programs without
        assert all(whole) if harness == "openevolve-full" else not any(whole)
    if harness == "vpo":  # vpo stops itself at its own --token-budget, the proxy's count
        assert run.refused == 0 and "token budget spent" in (folder / "harness.log").read_text()
    else:
        assert run.cut and run.refused >= 1  # the proxy refused it on: the budget stopped it

    # Programs were proposed and scored by the project's scorer; some were valid.
    assert 0 < run.valid <= run.proposals and len(run.program_scores) >= 1
    assert run.objectives == ["fit_id", "fit_ood", "simplicity"]
    if harness != "vpo":
        scored = [e for e in read_scores(folder / "scores.jsonl") if e["event"] == "end"]
        assert {e["status"] for e in scored} >= {"ok", "invalid"}  # the refusal was scored too

    # The program the harness calls best was scored again by the project's scorer.
    assert run.best_code and run.rescored_status == "ok" and run.rescored is not None
    if harness != "vpo":
        logged = [e for e in scored if e["code"] == run.best_code and e["status"] == "ok"]
        assert logged, "the peer's best program was never sent to the project's scorer"
        for name, value in run.rescored.items():
            assert value == pytest.approx(logged[0]["scores"][name], rel=1e-6, abs=1e-9)
    assert np.isfinite(run.best()).all()

    # The report and the plot were written.
    table = out.read_text()
    assert "## equation_discovery:oscillator1" in table and f"| {harness} | 0 |" in table
    assert picture.stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_reuses_finished_runs_and_runs_a_cut_one_again(tmp_path: Path) -> None:
    """A benchmark too long for one session goes on: with --resume a kept run that finished
    is reported again without a model call, and one a stop cut (no run.json) runs afresh."""
    model, kept = ScriptedModel(), tmp_path / "runs"

    def bench(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--harnesses", "vpo", "--problems", "oscillator1",
             "--seeds", "0,1", "--token-budget", str(3 * TOKENS_PER_ANSWER), "--base-url", url,
             "--model", "m", "--max-tokens", "300", "--keep", str(kept),
             "--out", str(tmp_path / "peers.md"), "--plot", str(tmp_path / "peers.png"), *extra],
            capture_output=True, text=True, timeout=500,
        )  # fmt: skip

    with chat_server(model) as url:
        assert bench().returncode == 0
        first = {seed: PeerRun.load(kept / f"equation_discovery-oscillator1-vpo-seed{seed}"
                                    / "run.json") for seed in (0, 1)}  # fmt: skip
        asked = len(model.bodies)
        again = bench()
        assert again.returncode == 1 and "--resume" in again.stderr  # never over a kept run

        cut = kept / "equation_discovery-oscillator1-vpo-seed1"
        (cut / "run.json").unlink()
        resumed = bench("--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[equation_discovery:oscillator1 seed 0 vpo] kept" in resumed.stderr
    assert "seed 1 vpo] was cut before it finished" in resumed.stderr
    redone = PeerRun.load(cut / "run.json")
    assert len(model.bodies) - asked == redone.calls >= 1  # seed 1 alone asked the model again
    assert min(redone.tokens, first[1].tokens) >= 3 * TOKENS_PER_ANSWER
    table = (tmp_path / "peers.md").read_text()
    assert "| vpo | 0 |" in table and "| vpo | 1 |" in table


def test_a_failed_run_is_recorded_and_the_benchmark_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One harness's run that fails (an exit, a stall) is a line of the report with its
    reason; the runs after it still run."""
    started: list[tuple[str, int]] = []

    def run_one(harness: str, problem: str, seed: int, args: Any, folder: Path) -> Any:
        started.append((harness, seed))
        folder.mkdir(parents=True)
        if (harness, seed) == ("vpo", 0):
            raise peers.RunFailed("vpo seed 0 failed (exit 3): vpo: error: an answer")
        scores = np.array([[0.2, 0.1, 0.0]])
        return PeerRun(
            harness, problem, seed, OBJECTIVES, 6000, np.array([0], dtype=np.int64), scores,
            4, 1, 6100, 4, 1, 60.0, None, None, None,
        )  # fmt: skip

    monkeypatch.setattr(peers, "run_one", run_one)
    out = tmp_path / "peers.md"
    peers.main(
        ["--harnesses", "vpo,vpo-train", "--problems", "oscillator1", "--seeds", "0,1",
         "--base-url", "http://127.0.0.1:1/v1", "--keep", str(tmp_path / "runs"),
         "--out", str(out), "--plot", str(tmp_path / "peers.png")]
    )  # fmt: skip
    assert started == [("vpo", 0), ("vpo-train", 0), ("vpo", 1), ("vpo-train", 1)]
    assert "failed, going on: vpo seed 0 failed (exit 3)" in capsys.readouterr().err
    table = out.read_text()
    assert "Runs that failed" in table
    assert "- equation_discovery:oscillator1 seed 0 vpo: vpo seed 0 failed (exit 3)" in table
