"""What `vpo db plot` draws, read back from the matplotlib figures: training metrics grouped
with y-labels and the constant ones named in a note, the policy versions that sampled each
iteration, legends beside the axes (never over a point), and an objective held at 0 explained
in the problem's own words."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.observation import plots
from harness.observation.gists import ProblemFacts, gist, version_starts
from harness.records import CandidateRecord, NewGroup, NewProgram, PolicyVersion, RolloutRecord
from harness.store import Store

PROBLEM = "equation_discovery:oscillator1"


def _program(code: str, fit_id: float, fit_ood: float, simplicity: float = 0.0) -> NewProgram:
    scores = {"fit_id": fit_id, "fit_ood": fit_ood, "simplicity": simplicity}
    return NewProgram(code, "ok", scores, dict(scores))


def _metrics(step: int) -> dict[str, Any]:
    # kl, groups and sampler_fraction hold one value all along; the rest move.
    return {
        "step": step,
        "groups": 1,
        "loss": 0.1 * step,
        "policy_loss": 0.09 * step,
        "kl": 0.0,
        "mean_ratio": 1 + 0.01 * step,
        "clip_fraction": 0.02 * step,
        "set_score": 0.3 - 0.1 * step,
        "diversity": 0.1 * step,
        "grad_norm": 1.5 / step,
        "sampler_fraction": 1.0,
        "advantage": "vpo",
    }


def equation_campaign(path: Path) -> str:
    """A finished equation-discovery campaign whose seed stays best on fit_id and whose every
    program scores 0 on simplicity (none beat the gate): iterations 0 and 1 sampled by the
    starting weights, 2 by version 1, 3 and 4 by version 2."""
    from problems.registry import load

    expression = load(PROBLEM).compact
    assert expression is not None
    url = str(path)
    store = Store.open(url)
    campaign = store.create_campaign("eq", PROBLEM, {"iterations": 5}, 0)
    seed_code = expression.program("params[0] * x + params[1] * v + params[2]")
    seed = store.add_program(campaign, _program(seed_code, 0.5, 0.1))
    bodies = ["params[0] * x", "params[0] * np.sin(x)", "params[0] * x * v", "x", "v * x"]
    version = None
    for iteration, body in enumerate(bodies):
        if iteration in (2, 3):
            version = store.record_train_step(
                campaign,
                step=iteration - 1,
                path=f"step-{iteration - 1}",
                metrics=_metrics(iteration - 1),
                group_ids=[iteration - 1, iteration] if iteration == 2 else [iteration + 0],
            )
        program = _program(expression.program(body), 0.1 + 0.05 * iteration, 0.12)
        rollout = RolloutRecord(
            "text", [1, 2], [-0.1, -0.2], "stop", "ok", None, [CandidateRecord(1, "new", program)]
        )
        store.record_iteration(
            campaign,
            NewGroup(
                iteration=iteration,
                island=0,
                parent_id=seed,
                draft_ids=(),
                prompt=[{"role": "user", "content": "improve"}],
                prompt_token_ids=[5],
                rollouts=[rollout],
                version=version,
            ),
        )
    store.record_train_step(campaign, step=3, path="step-3", metrics=_metrics(3), group_ids=[4, 5])
    store.set_campaign_status(campaign, "finished", "token budget spent: 60 of 50 tokens")
    store.close()
    return url


@pytest.fixture
def figures(tmp_path: Path) -> dict[str, Any]:
    import matplotlib.pyplot as plt

    with Store.open(equation_campaign(tmp_path / "eq.db")) as store:
        drawn = plots.plot_figures(store, 1)
    for figure in drawn.values():
        figure.canvas.draw()
    yield drawn
    for figure in drawn.values():
        plt.close(figure)


def _texts(figure: Any) -> list[str]:
    """The figure's notes (a blank line apart), each unwrapped to one line."""
    return [" ".join(n.split()) for t in figure.texts for n in t.get_text().split("\n\n")]


def test_training_panels_are_grouped_labelled_and_constant_metrics_named(figures) -> None:
    training = figures["training.png"]
    groups = [sub.get_suptitle() for sub in training.subfigs]
    assert groups == [
        "Loss",
        "Ratio and clipping",
        "Set score and diversity",
        "Other step metrics",
    ]  # no KL group: kl held 0 all along
    drawn = {
        sub.get_suptitle(): [a.get_title() for a in sub.axes if a.get_visible() and a.lines]
        for sub in training.subfigs
    }
    assert drawn["Loss"] == ["loss", "policy_loss"]
    assert drawn["Ratio and clipping"] == ["mean_ratio", "clip_fraction"]
    assert drawn["Other step metrics"] == ["grad_norm"]
    for axis in training.axes:
        if axis.lines:
            assert axis.get_ylabel() and axis.get_ylabel() != "value"
    assert _texts(training) == [
        "Left out, the same at every step: groups 1, kl 0, sampler_fraction 1."
    ]


def test_iterations_show_where_each_policy_version_first_sampled(figures) -> None:
    top, bottom = figures["iterations.png"].axes
    for axis in (top, bottom):
        boundaries = [line.get_xdata()[0] for line in axis.lines if line.get_linestyle() == ":"]
        assert boundaries == [1.5, 2.5]  # v1 from iteration 2, v2 from iteration 3
        assert axis.get_ylabel() not in ("", "value")
    assert [t.get_text() for t in top.texts] == ["v1", "v2"]


def test_no_legend_covers_the_axes(figures) -> None:
    legends = 0
    for name, figure in figures.items():
        renderer = figure.canvas.get_renderer()
        for axis in figure.axes:
            legend = axis.get_legend()
            if legend is None:
                continue
            legends += 1
            box, plotted = legend.get_window_extent(renderer), axis.get_window_extent(renderer)
            assert not box.overlaps(plotted), f"{name}: the legend lies over the axes"
    assert legends >= 3


def test_an_objective_held_at_0_is_explained_by_the_problem(figures) -> None:
    from problems.registry import load

    why = load(PROBLEM).objective("simplicity").description
    pareto = _texts(figures["pareto_fit_id_simplicity.png"])
    assert f"simplicity is 0 for every valid program: {why}" in pareto
    assert f"simplicity is 0 for every valid program: {why}" in _texts(figures["best.png"])
    # fit_id is 0 for none of the programs: no line about it.
    assert not any(line.startswith("fit_id") for line in pareto)


def test_an_objective_at_0_throughout_is_noted_without_a_problem(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "toy.db")) as store:
        campaign = store.create_campaign("toy", "no_such_problem", {}, 0)
        for a in (0.2, 0.4):
            store.add_program(
                campaign, NewProgram("def f():\n    return 1\n", "ok", {"a": a, "b": 0.0}, {})
            )
        drawn = plots.plot_figures(store, campaign)
    assert _texts(drawn["pareto_a_b.png"]) == ["b is 0 for every valid program."]


def test_plot_writes_every_figure(tmp_path: Path) -> None:
    with Store.open(equation_campaign(tmp_path / "eq.db")) as store:
        files = plots.plot(store, 1, tmp_path / "plots")
    assert [f.name for f in files][-3:] == ["training.png", "iterations.png", "progress.png"]
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in files)


def _policy(step: int, metrics: dict[str, float]) -> PolicyVersion:
    return PolicyVersion(step, 1, step, f"step-{step}", metrics, datetime.now(UTC))


values = st.one_of(st.integers(-3, 3), st.floats(-2, 2, allow_nan=False))
runs = st.lists(
    st.dictionaries(st.sampled_from(["loss", "kl", "mean_ratio", "tokens", "x"]), values),
    max_size=5,
)


@given(runs)
def test_training_layout_draws_each_metric_once_or_names_it_constant(run) -> None:
    policies = [_policy(i + 1, metrics) for i, metrics in enumerate(run)]
    layout, constant = plots.training_layout(policies)
    drawn = [key for _, keys in layout for key in keys]
    assert sorted(drawn + list(constant)) == plots.training_panels(policies)
    for key, value in constant.items():
        stored = [p.metrics[key] for p in policies if key in p.metrics]
        assert len(stored) > 1 and all(v == value for v in stored)
    if len(policies) < 2:
        assert constant == {}


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 6)), max_size=30))
def test_version_starts_are_each_versions_first_iteration(sampled) -> None:
    versions = [(i + 1, iteration, step) for i, (iteration, step) in enumerate(sampled)]
    starts = version_starts(versions)
    assert [s for _, s in sorted(starts, key=lambda x: x[1])] == sorted(
        {s for _, s in sampled if s > 0}
    )
    for iteration, step in starts:
        assert iteration == min(i for i, s in sampled if s == step)


def test_gist_is_the_expression_or_a_line_of_code() -> None:
    from problems.registry import load

    problem = load(PROBLEM)
    facts = ProblemFacts(entry=problem.entry, compact=problem.compact)
    code = problem.compact.program("params[0] * x")
    assert gist(code, facts)["kind"] == "expression"
    assert gist(code, facts)["text"] == "params[0] * x"
    # Without the problem: the only expression its function returns.
    assert gist("def f(x):\n    '''Doc.'''\n    return x *  2\n", ProblemFacts())["text"] == "x * 2"
    long = "import numpy as np\n\ndef pack(n):\n    k = n + 1\n" + "    k += 1\n" * 400
    shown = gist(long + "    return k\n", ProblemFacts(entry="pack"))
    assert shown["kind"] == "code" and shown["text"] == "pack: k = n + 1 … (404 lines)"
    assert len(shown["code"]) == 2000 and shown["code"].endswith("…")
    assert (
        gist("<script>alert(1)</script>", ProblemFacts())["text"]
        == "<script>alert(1)</script> … (1 lines)"
    )
