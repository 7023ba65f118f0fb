"""benchmarks/discovery.py's measures: the hypervolume against hand-computed cases and an exact
count over the grid cells, and the running best against tokens."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).parents[1] / "benchmarks" / "discovery.py"
discovery = load_benchmark("discovery")
# discovery.py puts benchmarks/ on sys.path: its measures and report live beside it.
import discovery_report  # noqa: E402
import discovery_runs  # noqa: E402

from trainer.measures import front_points, hypervolume  # noqa: E402


def cell_count_hypervolume(points: np.ndarray) -> float:
    """The same volume by brute force: cut space along every coordinate that occurs (and 0)
    into cells, and add the cells whose upper corner some point dominates."""
    points = np.clip(points, 0.0, None)
    d = points.shape[1]
    cuts = [np.unique(np.append(points[:, j], 0.0)) for j in range(d)]
    total = 0.0
    for cell in itertools.product(*(range(1, len(c)) for c in cuts)):
        upper = np.array([cuts[j][i] for j, i in enumerate(cell)])
        if np.any(np.all(points >= upper, axis=1)):
            total += float(np.prod([cuts[j][i] - cuts[j][i - 1] for j, i in enumerate(cell)]))
    return total


def test_hypervolume_by_hand() -> None:
    hv = hypervolume
    assert hv(np.zeros((0, 3))) == 0.0
    assert hv(np.array([[1.0, 2.0, 3.0]])) == pytest.approx(6.0)
    # Two boxes of 6 overlapping in [0,1] x [0,2] x [0,1].
    assert hv(np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])) == pytest.approx(10.0)
    # A dominated point and a repeated one add nothing; a zero side spans no volume.
    assert hv(np.array([[1.0, 2.0, 3.0], [0.5, 1.0, 1.0], [1.0, 2.0, 3.0]])) == pytest.approx(6)
    assert hv(np.array([[5.0, 5.0, 0.0], [1.0, 1.0, 1.0]])) == pytest.approx(1.0)
    # Scores above 1 (beating the best known value) count in full.
    assert hv(np.array([[2.5, 1.0, 0.4]])) == pytest.approx(1.0)
    assert hv(np.array([[0.3, 0.7]])) == pytest.approx(0.21)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda d: st.lists(
            st.lists(st.integers(0, 6), min_size=d, max_size=d), min_size=1, max_size=7
        )
    )
)
def test_hypervolume_is_the_dominated_volume(rows: list[list[int]]) -> None:
    points = np.array(rows, dtype=np.float64) / 2
    assert hypervolume(points) == pytest.approx(cell_count_hypervolume(points))
    # Neither the order of the points nor that of the objectives matters.
    assert hypervolume(points[::-1, ::-1]) == pytest.approx(hypervolume(points))


def test_pareto_front_keeps_the_undominated_once() -> None:
    points = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.4, 0.4], [1.0, 0.0]])
    front = front_points(points)
    assert sorted(map(tuple, front)) == [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]


def test_best_so_far_is_the_running_max_by_tokens() -> None:
    tokens = np.array([0, 100, 100, 250])
    values = np.array([[0.0, 0.2], [0.5, 0.1], [0.3, 0.4], [0.4, 0.9]])
    grid = np.array([-1, 0, 99, 100, 300])
    best = discovery_runs.best_so_far(tokens, values, grid)
    assert best[0].tolist() == [-np.inf, -np.inf]
    assert best[1:].tolist() == [[0.0, 0.2], [0.0, 0.2], [0.5, 0.4], [0.5, 0.9]]
    volume = discovery_runs.hypervolume_so_far(tokens, values, np.array([0, 100, 300]))
    assert volume.tolist() == pytest.approx([0.0, 0.5 * 0.1 + 0.3 * 0.3, 0.4 * 0.9 + 0.1 * 0.1])


def test_the_hypervolume_leaves_out_objectives_no_program_scored_on() -> None:
    """simplicity's gate never opened in a short run: over all three objectives every
    hypervolume would be 0, so the report takes the objectives some program scored on."""

    def result(scores: list[list[float]]) -> object:
        values = np.array(scores, dtype=np.float64)
        return discovery.RunResult(
            "none", 0, ["fit_id", "fit_ood", "simplicity"], 1.0, 0, 0, 0, 0, 0.0,
            np.zeros(len(values), dtype=np.int64), values, 0.0, 0.0, 0.0, 0.0, 8, 6,
        )  # fmt: skip

    runs = {"none": [result([[0.2, 0.1, 0.0]])], "vpo": [result([[0.1, 0.3, 0.0]])]}
    assert discovery_runs.live_objectives(runs) == [0, 1]
    assert runs["none"][0].hypervolume([0, 1]) == pytest.approx(0.02)
    assert runs["none"][0].hypervolume([0, 1, 2]) == 0.0
    nothing = {"none": [result([[0.0, 0.0, 0.0]])]}
    assert discovery_runs.live_objectives(nothing) == [0, 1, 2]
    assert runs["none"][0].trained_share == 0.75


def test_the_probe_table_sets_version_zero_beside_each_arms_last_version() -> None:
    def measured(step: int, best: float) -> dict:
        return {"step": step, "parse_rate": 0.5, "valid": 12, "mean_score": best / 4,
                "set_score": best / 2, "diversity": None if step else 0.1,
                "best_at": list(np.linspace(best / 10, best, 30))}  # fmt: skip

    def result(arm: str, probe: dict | None, seed: int = 0) -> object:
        values = np.zeros((1, 2))
        return discovery.RunResult(
            arm, seed, ["a", "b"], 1.0, 0, 0, 0, 0, 0.0, np.zeros(1, dtype=np.int64), values,
            0.0, 0.0, 0.0, 0.0, 8, 6, probe,
        )  # fmt: skip

    runs = {
        "none": [result("none", {0: measured(0, 0.2)})],
        "vpo": [result("vpo", {40: measured(40, 0.4)}), result("vpo", {41: measured(41, 0.6)})],
    }
    rows = [line for line in discovery_report.probe_table(runs) if line.startswith("| ")]
    assert rows[1].startswith("| version 0 (m = 3) | 0 | 0.50 | 12 |")
    # Arms of one m run apart each probed version 0 of seed 0: one row still, over seeds.
    both = {**runs, "multi": [result("multi", {0: measured(0, 0.9), 30: measured(30, 0.5)}),
                              result("multi", {0: measured(0, 0.4)}, seed=1)]}  # fmt: skip
    rows_both = [line for line in discovery_report.probe_table(both) if line.startswith("| ")]
    zero = [row for row in rows_both if row.startswith("| version 0")]
    assert len(zero) == 1 and zero[0].endswith("| 0.3000 [0.2000, 0.4000] |")  # seeds 0, 1
    last = rows[2].split(" | ")
    assert last[0] == "| VPO in the loop (m = 3): last version" and last[1] == "40 [40, 41]"
    assert rows[2].endswith("| 0.5000 [0.4000, 0.6000] |")  # best@30: the pools' best
    assert last[6] == "-"  # no diversity measured
    assert discovery_report.probe_table({"none": [result("none", None)]}) == []


def _load(name: str) -> object:
    sys.path.insert(0, str(_PATH.parent))
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", _PATH.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_probes_set_score_is_vpos() -> None:
    """benchmarks/probe.py's set score: with two objectives and w ~ Dirichlet(1), a completion
    whose candidates are the two corners scores E[max(w, 1 - w)] = 3/4, a compromise (0.6, 0.6)
    0.6, and a copy of one corner what that corner alone scores, 1/2."""
    probe = _load("probe")
    rng = np.random.default_rng(0)
    corners = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    compromise = np.array([[[0.6, 0.6], [0.6, 0.6]]])
    copies = np.array([[[1.0, 0.0], [1.0, 0.0]]])
    assert probe.set_score(corners, rng) == pytest.approx(0.75, abs=0.02)
    assert probe.set_score(compromise, rng) == pytest.approx(0.6)
    assert probe.set_score(copies, rng) == pytest.approx(0.5, abs=0.03)
    both = np.concatenate([corners, compromise])
    assert probe.set_score(both, np.random.default_rng(1)) == pytest.approx(0.675, abs=0.02)


def test_a_run_summary_gives_back_the_run_it_was_written_from(tmp_path: Path) -> None:
    """A kept run's summary (.run.json) stands in for its database: the same scores, tokens
    and probe (whose step keys JSON turns into strings), and --report-from reads it first."""
    probe = {0: {"step": 0, "best_at": [0.0, 0.1]}, 12: {"step": 12, "best_at": [0.2, 0.3]}}
    result = discovery.RunResult(
        "vpo", 1, ["fit_id", "fit_ood"], 61.5, 900, 7, 6, 5, 30.25,
        np.array([0, 120, 480], dtype=np.int64), np.array([[0.1, 0.0], [0.3, 0.2], [0.2, 0.4]]),
        0.05, 0.8, 0.9, 0.7, 28, 24, probe,
    )  # fmt: skip
    result.save(discovery.summary_path(discovery.database(tmp_path, "vpo", 1)))
    back = discovery.kept_run("vpo", 1, tmp_path)  # no database there: the summary alone
    assert back.program_tokens.dtype == np.int64
    np.testing.assert_array_equal(back.program_tokens, result.program_tokens)
    np.testing.assert_array_equal(back.program_scores, result.program_scores)
    assert back.probe == probe
    assert back.best.tolist() == [0.3, 0.4] and back.trained_share == 24 / 28
    with pytest.raises(SystemExit, match="missing"):
        discovery.kept_run("grpo", 1, tmp_path)


def test_extend_goes_on_with_kept_runs_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--extend resumes the runs of --keep DIR to a larger budget: without --keep, or with no
    run kept there, it says so before anything runs; a run of the plan not kept there (a grid
    cut short) starts afresh, and is named."""

    def main(*argv: str) -> str:
        monkeypatch.setattr(sys, "argv", ["discovery.py", *argv])
        with pytest.raises(SystemExit) as exit:
            discovery.main()
        return f"{exit.value.code} {capsys.readouterr().err}"

    assert "--extend goes on with the runs of --keep DIR" in main("--extend")
    said = main("--extend", "--keep", str(tmp_path), "--arms", "vpo,grpo", "--seeds", "0")
    assert "--extend goes on with kept runs; none in" in said
    (tmp_path / "vpo-seed0.db").write_bytes(b"")
    started: list[str] = []

    def run(arm: str, seed: int, *rest: object) -> None:
        started.append(arm)
        raise SystemExit("stopped before running")

    monkeypatch.setattr(discovery, "run", run)
    said = main("--extend", "--keep", str(tmp_path), "--arms", "grpo,vpo", "--seeds", "0")
    assert "--extend: not kept, run afresh: grpo seed 0\n" in said
    assert started == ["grpo"]
    said = main("--keep", str(tmp_path), "--arms", "vpo", "--seeds", "0")
    assert "already there" in said and "--extend" in said


def test_a_failed_run_is_recorded_and_the_grid_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `vpo run` that ends badly is a row of the report with its reason; the arms and seeds
    after it still run, and --report-from reads the failure back from the kept folder."""
    started: list[tuple[str, int]] = []

    def run(arm: str, seed: int, args: object, folder: Path, *rest: object) -> object:
        started.append((arm, seed))
        db = discovery.database(folder, arm, seed)
        if (arm, seed) == ("vpo", 0):
            db.with_suffix(".failed").write_text("exit 3: vpo: error: a model answer\n")
            raise discovery.RunFailed("exit 3: vpo: error: a model answer")
        result = discovery.RunResult(
            arm, seed, ["fit_id", "fit_ood"], 10.0, 900, 7, 0, 0, 0.0,
            np.array([0, 120], dtype=np.int64), np.array([[0.1, 0.0], [0.3, 0.2]]),
            0.05, 0.8, 0.9, 0.7, 28, 0,
        )  # fmt: skip
        result.save(discovery.summary_path(db))
        return result

    monkeypatch.setattr(discovery, "run", run)
    out, keep = tmp_path / "grid.md", tmp_path / "kept"
    common = ["--arms", "none,vpo", "--seeds", "0,1", "--out", str(out)]
    common += ["--plot", str(tmp_path / "grid.png")]
    monkeypatch.setattr(sys, "argv", ["discovery.py", *common, "--keep", str(keep)])
    discovery.main()
    assert started == [("none", 0), ("vpo", 0), ("none", 1), ("vpo", 1)]
    assert "[2/4 vpo seed 0] failed, the grid goes on: exit 3" in capsys.readouterr().err
    table = out.read_text()
    assert "| vpo | 0 | exit 3: vpo: error: a model answer |" in table
    assert "| vpo | 1 |" in table and "| none | 0 |" in table
    monkeypatch.setattr(sys, "argv", ["discovery.py", *common, "--report-from", str(keep)])
    out.unlink()
    discovery.main()
    assert "| vpo | 0 | exit 3: vpo: error: a model answer |" in out.read_text()
    # An arm kept on fewer seeds than the rest: named in the report, the rest reported.
    discovery.summary_path(discovery.database(keep, "vpo", 1)).unlink()
    out.unlink()
    discovery.main()
    table = out.read_text()
    assert "| vpo | 1 | not run |" in table and "| none | 1 |" in table
    assert "not kept, left out: vpo seed 1" in capsys.readouterr().out
    empty = ["discovery.py", *common, "--report-from", str(tmp_path / "nothing")]
    monkeypatch.setattr(sys, "argv", empty)
    with pytest.raises(SystemExit, match="no kept run of --arms none,vpo in"):
        discovery.main()


def test_front_coverage_is_the_r2_indicator_and_stays_open_with_a_closed_objective() -> None:
    """Coverage is the mean best weighted sum over fixed weightings: a point of all ones
    scores 1, adding a dominated point changes nothing, and an objective at 0 for every
    program (where the hypervolume is 0) still leaves the others' progress visible."""
    assert discovery_runs.coverage(np.zeros((0, 3))) == 0.0
    assert discovery_runs.coverage(np.ones((1, 3))) == pytest.approx(1.0)
    front = np.array([[0.9, 0.1, 0.0], [0.1, 0.9, 0.0]])
    assert discovery_runs.coverage(
        np.vstack([front, [[0.05, 0.05, 0.0]]])
    ) == discovery_runs.coverage(front)
    better = np.array([[0.95, 0.1, 0.0], [0.1, 0.9, 0.0]])
    assert discovery_runs.coverage(better) > discovery_runs.coverage(front) > 0
    assert hypervolume(better) == 0.0


def test_the_paired_interval_is_a_bootstrap_of_the_seed_differences() -> None:
    mean, low, high = discovery_runs.paired_interval([0.1, 0.2, 0.3, 0.2, 0.2])
    assert mean == pytest.approx(0.2) and 0.1 <= low < 0.2 < high <= 0.3
    mean, low, high = discovery_runs.paired_interval([-0.1, 0.1])
    assert low < 0 < high  # two seeds that disagree cannot separate the arms
    assert discovery_runs.paired_interval([0.5]) == (0.5, 0.5, 0.5)


def test_the_discovery_reward_arms_pass_their_reward_and_vpo_keeps_the_papers() -> None:
    parser_args = discovery.argparse.Namespace(
        problem="equation_discovery:oscillator1", model="qwen-coder", backend="auto",
        concurrency=1, group_size=4, max_tokens=160, temperature=1.0, iterations=10,
        token_budget=100, drafts=0, form="compact", micro_batch=4, format_reward="partial",
        overlong_buffer=0, train_every=1, lora_rank=16, learning_rate=1e-4, kl_beta=0.0,
        reward_reference="campaign", slot_cost=0.05, warmup_samples=0, gain="signed",
        vector="cases", parent_selection="lexicase",
    )  # fmt: skip
    for arm, advantage in (("vpo_front", "vpo"), ("entropic", "entropic")):
        command = discovery.run_command(arm, 0, parser_args, Path("/tmp/x.db"))
        at = command.index("--reward-reference")
        assert command[at : at + 4] == ["--reward-reference", "campaign", "--slot-cost", "0.05"]
        assert command[command.index("--advantage") + 1] == advantage
        assert command[command.index("--gain") + 1] == "signed"
        assert command[command.index("--vector") + 1] == "cases"
    papers = discovery.run_command("vpo", 0, parser_args, Path("x.db"))
    assert "--reward-reference" not in papers and "--gain" not in papers
    assert papers[papers.index("--vector") + 1] == "cases"  # every trained arm, one vector
    untrained = discovery.run_command("none", 0, parser_args, Path("x.db"))
    assert "--vector" not in untrained
    assert untrained[untrained.index("--parent-selection") + 1] == "lexicase"


def test_the_discovery_reward_arms_are_paired_against_grpo_and_the_papers_vpo_too() -> None:
    """Against no training every arm has a row; against GRPO only the arms that change VPO's
    reward and the paper's VPO, with the last probed version's diversity beside the rest."""

    def result(arm: str, seed: int, diversity: float, probed: float | None) -> object:
        scores = np.array([[0.1 * (seed + 1), 0.0]])
        probe = None if probed is None else {40: {"step": 40, "diversity": probed}}
        return discovery.RunResult(
            arm, seed, ["a", "b"], 1.0, 0, 0, 0, 0, 0.0, np.zeros(1, dtype=np.int64), scores,
            diversity, 0.0, 0.0, 0.0, 8, 6, probe,
        )  # fmt: skip

    runs = {
        "none": [result("none", s, 0.1, None) for s in range(3)],
        "grpo": [result("grpo", s, 0.2, 0.3) for s in range(3)],
        "vpo_front": [result("vpo_front", s, 0.2 + 0.1 * (s + 1), 0.4) for s in range(3)],
    }
    against_none = [row for row in discovery_report.paired_table(runs, [0]) if row.startswith("| ")]
    assert [row.split(" | ")[0] for row in against_none[1:]] == [
        "| GRPO in the loop (m = 1)", "| VPO, discovery reward (m = 3)"
    ]  # fmt: skip
    table = discovery_report.paired_table(runs, [0], "grpo")
    assert "against GRPO in the loop (m = 1)" in table[1]
    rows = [row for row in table if row.startswith("| ")]
    assert rows[0].endswith("| pool diversity | probe diversity, last version |")
    (row,) = rows[1:]
    cells = row.split(" | ")
    assert cells[0] == "| VPO, discovery reward (m = 3)" and cells[1] == "3"
    assert cells[2] == "+0.0000 [+0.0000, +0.0000]"  # the same best a on every seed
    assert cells[-2].startswith("+0.2000 [+0.1")  # pool diversity 0.1, 0.2, 0.3 above GRPO's
    assert cells[-1] == "+0.1000 [+0.1000, +0.1000] |"
    # No paper's VPO in the grid: no table against it.
    assert discovery_report.paired_table(runs, [0], "vpo") == []


def test_the_probe_counts_the_slots_above_the_seed(tmp_path: Path) -> None:
    """benchmarks/probe.py's `score` through a real campaign's parsing and sandbox: a slot
    counts as above the seed when its fit_id beats the seed's by MARGIN (issue 57's
    discovery); a copy of the seed, an unparsed slot and a worse equation do not, and two slots
    of one program are one distinct program."""
    from harness.config.settings import build
    from harness.evaluation.sandbox import Sandbox
    from harness.evolution.loop import prepare
    from harness.store import Store
    from problems.equation_discovery import EquationDiscovery

    probe = _load("probe")
    problem = EquationDiscovery("oscillator1")
    better = "params[0] * x + params[1] * v**3 + params[2] * x**3 + params[3] * x * v"
    seed = "params[0] * x + params[1] * v + params[2]"
    texts = [
        f"<candidate_1>{better}</candidate_1><candidate_2>{seed}</candidate_2>",
        f"<candidate_1>params[0] * x</candidate_1><candidate_2>{better}</candidate_2>",
        "<candidate_1>not an expression(</candidate_1>",
    ]
    config = build({"problem": problem.name, "candidates": 2, "form": "compact"})
    store = Store.open(tmp_path / "probe.db")
    campaign_id = store.create_campaign("probe", problem.name, config.to_dict(), 0)
    with Sandbox(workers=2) as box:
        campaign = prepare(config, store, problem, campaign_id, box)
        seed_program = store.program(campaign.seed_id)
        measured = probe.score(texts, campaign, seed_program.code, seed_program.scores["fit_id"])
    store.close()
    assert measured["slots"] == 6 and measured["valid"] == 4
    assert measured["above"] == 2 and measured["above_distinct"] == 1
    assert measured["best"][0] >= seed_program.scores["fit_id"] + probe.MARGIN
