"""Case vectors (issue 58, item 2): a problem's separate cases scored beside its objectives,
stored with the program, left out of every list of objectives, and trained on with
`[training] vector = "cases"`. Equation discovery's cases are test_id cut into rings by the
distance of the inputs from the training mean: each ring's NMSE, computed here with a loop."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import SMALL_SEED, _rollout, record_group

from harness.config.errors import UserError
from harness.config.settings import build
from harness.config.training import TrainSettings
from harness.evaluation.evaluate import evaluate_many
from harness.evaluation.sandbox import Sandbox
from harness.evolution.iteration import new_program
from harness.learning.rewards import to_group
from harness.learning.steps import trained_vector
from harness.records import CASE_PREFIX, CandidateRecord
from harness.store import Store
from problems.api import Evaluation, combine
from problems.circle_packing import CirclePacking
from problems.equation_discovery import RINGS, SPECS, EquationDiscovery, dataset, rings

HEADER = "import numpy as np\n\n\ndef equation(x, v, params):\n"
SEED = HEADER + "    return params[0] * x + params[1] * v + params[2]\n"
CUBIC = HEADER + "    return params[0] * x + params[1] * v + params[2] * x**3\n"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(workers=2) as box:
        yield box


@pytest.mark.parametrize("key", sorted(SPECS))
def test_the_rings_cut_test_id_into_disjoint_parts_of_equal_size(key: str) -> None:
    parts = rings(key)
    rows = len(dataset(key)["test_id"].target)
    assert len(parts) == RINGS
    assert sorted(np.concatenate(parts).tolist()) == list(range(rows))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # nearest the centre first: every row of ring i is at most as far as any row of ring i + 1
    data = dataset(key)
    train = data["train"].inputs
    far = np.linalg.norm((data["test_id"].inputs - train.mean(0)) / train.std(0), axis=1)
    for inner, outer in zip(parts, parts[1:], strict=False):
        assert far[inner].max() <= far[outer].min()


def test_each_case_is_its_rings_nmse_on_fit_ids_scale() -> None:
    problem = EquationDiscovery("oscillator1")
    data = dataset("oscillator1")
    noise = np.random.default_rng(0).normal(0, 0.01, size=(3, 10000))
    value = {s: data[s].target + noise[i] for i, s in enumerate(("train", "test_id", "test_ood"))}
    fit = {"params": np.ones(10), "training_mse": float(np.mean(noise[0] ** 2))}
    call = problem.follow_up(problem.calls()[0], fit, problem.seed_program)
    assert call is not None and call.cases == tuple(c.name for c in problem.cases)
    raw = problem.score(call, value)
    evaluation = combine(problem, {"fit": ("ok", raw, None)})
    target = data["test_id"].target
    for i, rows in enumerate(rings("oscillator1")):
        error = sum((value["test_id"][r] - target[r]) ** 2 for r in rows)
        mean = sum(target[r] for r in rows) / len(rows)
        spread = sum((target[r] - mean) ** 2 for r in rows)
        name = f"id_ring{i + 1}"
        assert raw[name] == pytest.approx(error / spread, rel=1e-9)
        fit_id = problem.objective("fit_id")
        expected = math.log(1 / (error / spread)) / math.log(1 / fit_id.best_known)
        assert evaluation.cases[name] == pytest.approx(expected, rel=1e-9)
        assert evaluation.case_raw[name] == raw[name]
    # the objectives are as they were: no case among them
    assert set(evaluation.scores) == {"fit_id", "fit_ood", "simplicity"}
    assert set(evaluation.to_json()["cases"]) == {c.name for c in problem.cases}


def test_a_failed_program_scores_zero_on_every_case() -> None:
    problem = EquationDiscovery("oscillator1")
    names = {c.name for c in problem.cases}
    empty = problem.empty_evaluation("invalid", "refused")
    assert empty.cases == dict.fromkeys(names, 0.0) and set(empty.case_raw) == names
    failed = combine(problem, {"fit": ("timeout", {}, "too slow")})
    assert failed.cases == dict.fromkeys(names, 0.0)


def test_a_cubic_term_trades_one_ring_for_another(sandbox: Sandbox) -> None:
    """Why cases: fit_id moves by 0.001 between the seed and seed + x**3 while the rings move
    apart, the inner ones down and the outer ones up (real sandbox, oscillator1)."""
    problem = EquationDiscovery("oscillator1")
    seed, cubic = evaluate_many(problem, [SEED, CUBIC], sandbox)
    assert seed.status == cubic.status == "ok", (seed.reason, cubic.reason)
    assert abs(cubic.scores["fit_id"] - seed.scores["fit_id"]) < 0.005
    assert cubic.cases["id_ring1"] < seed.cases["id_ring1"] - 0.01
    assert cubic.cases["id_ring3"] > seed.cases["id_ring3"]


def _evaluation(fit: float, rings_: list[float]) -> Evaluation:
    names = [f"id_ring{i + 1}" for i in range(len(rings_))]
    return Evaluation(
        "ok",
        {"fit_id": fit, "fit_ood": fit / 2, "simplicity": 0.5},
        {"fit_id": None, "fit_ood": None, "simplicity": None},
        cases=dict(zip(names, rings_, strict=True)),
        case_raw=dict.fromkeys(names, 0.1),
    )


def test_cases_are_stored_apart_from_the_objectives_and_trained_on(tmp_path) -> None:
    store = Store.open(str(tmp_path / "cases.db"))
    campaign = store.create_campaign("c", "equation_discovery", {"candidates": 2}, 0)
    seed = store.add_program(campaign, new_program(SMALL_SEED, _evaluation(0.2, [0.1, 0.3])))
    record_group(
        store,
        campaign,
        seed,
        _rollout(
            CandidateRecord(1, "new", new_program("a", _evaluation(0.3, [0.5, 0.1]))),
            CandidateRecord(2, "new", new_program("b", _evaluation(0.3, [0.1, 0.6]))),
        ),
    )
    assert store.objectives(campaign) == ["fit_id", "fit_ood", "simplicity"]
    cases = store.cases(campaign)
    assert cases == [CASE_PREFIX + "id_ring1", CASE_PREFIX + "id_ring2"]
    (group,) = store.training_groups(campaign)
    trained = to_group(group, cases, 2)
    assert trained is not None
    assert trained.scores[0].tolist() == [[0.5, 0.1], [0.1, 0.6]]
    on_objectives = to_group(group, store.objectives(campaign), 2)
    assert on_objectives is not None
    assert on_objectives.scores[0, :, 0].tolist() == [0.3, 0.3]
    store.close()


def test_the_vector_setting() -> None:
    problem = EquationDiscovery("oscillator1")
    cases = TrainSettings(train_every=1, vector="cases")
    assert trained_vector(cases, problem) == [CASE_PREFIX + c.name for c in problem.cases]
    assert trained_vector(TrainSettings(train_every=1), problem) == [
        "fit_id",
        "fit_ood",
        "simplicity",
    ]
    with pytest.raises(UserError, match="has no cases") as info:
        trained_vector(cases, CirclePacking())
    assert "\n" not in str(info.value)
    assert trained_vector(TrainSettings(vector="cases"), CirclePacking())  # no training: no error
    with pytest.raises(UserError, match="vector") as info:
        build({"problem": "equation_discovery", "train_every": 1, "vector": "rings"})
    assert "\n" not in str(info.value)


# --- parents by epsilon-lexicase over the cases (issue 58, item 4) -----------------------------


def _population(names: list[str], vectors: list[list[float]], valid: list[bool] | None = None):
    from harness.evolution.population import Population

    population = Population(names)
    population.extend(
        list(range(1, len(vectors) + 1)),
        [0] * len(vectors),
        vectors,
        valid=valid or [True] * len(vectors),
        code_hashes=[f"h{i}" for i in range(len(vectors))],
    )
    return population


def test_lexicase_keeps_the_specialists_that_a_weighting_passes_over() -> None:
    """A generalist (0.6 on every case) and three specialists (0.9 on one, 0.1 on the rest):
    under a random weighting the generalist is best unless one weight exceeds 0.625 (a chance
    of 0.42 under Dirichlet(1, 1, 1)); under lexicase the first case decides (epsilon, the
    median absolute deviation, is 0.25), so each specialist wins a third and the generalist
    never does."""
    from harness.evolution.selection import pick_parent, pick_parent_lexicase

    vectors = [[0.6, 0.6, 0.6], [0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.1, 0.1, 0.9]]
    cases = _population(["r1", "r2", "r3"], vectors)
    rng = np.random.default_rng(0)
    lexicase = np.bincount([pick_parent_lexicase(cases, 0, rng) for _ in range(900)], minlength=5)
    assert lexicase[1] == 0
    assert all(240 < count < 360 for count in lexicase[2:]), lexicase
    scalarised = np.bincount([pick_parent(cases, 0, rng) for _ in range(900)], minlength=5)
    assert scalarised[1] > 400, scalarised
    again = [pick_parent_lexicase(cases, 0, np.random.default_rng(5)) for _ in range(3)]
    assert len(set(again)) == 1  # one seed, one pick


def test_lexicase_takes_only_valid_programs_and_falls_back_like_scalarised() -> None:
    from harness.evolution.selection import pick_parent_lexicase

    cases = _population(["r1", "r2"], [[0.9, 0.9], [0.1, 0.1]], valid=[False, True])
    rng = np.random.default_rng(0)
    assert {pick_parent_lexicase(cases, 0, rng) for _ in range(50)} == {2}
    assert {pick_parent_lexicase(cases, 3, rng) for _ in range(50)} == {2}  # an empty island
    broken = _population(["r1", "r2"], [[0.0, 0.0]], valid=[False])
    assert pick_parent_lexicase(broken, 0, rng) == 1  # nothing valid: the failure, to repair


def test_a_lexicase_campaign_keeps_its_cases_beside_its_population(tmp_path, sandbox) -> None:
    """prepare() evaluates the seed through the real sandbox; the programs stored after it
    reach the case population with the same ids and their case scores."""
    from harness.evolution.loop import open_campaign, prepare
    from harness.evolution.run import refresh_population

    config = build({"problem": "equation_discovery", "parent_selection": "lexicase"})
    problem = EquationDiscovery("oscillator1")
    store = Store.open(str(tmp_path / "lexicase.db"))
    campaign = open_campaign(store, config, problem)
    run = prepare(config, store, problem, campaign, sandbox)
    assert run.cases is not None
    assert run.cases.objectives == tuple(CASE_PREFIX + c.name for c in problem.cases)
    assert run.cases.scores[0].min() > 0.05  # the seed's rings, from its real evaluation
    program = new_program("a", _evaluation(0.3, [0.5, 0.1, 0.2, 0.3]))
    record_group(store, campaign, run.seed_id, _rollout(CandidateRecord(1, "new", program)))
    refresh_population(run)
    # the seed (1), its copies on islands 1-3 (2-4) with its case scores, the new program (5)
    assert run.cases.ids.tolist() == run.population.ids.tolist() == [1, 2, 3, 4, 5]
    assert (run.cases.scores[1:4] == run.cases.scores[0]).all()
    assert run.cases.scores[4].tolist() == [0.5, 0.1, 0.2, 0.3]
    assert run.population.scores[4].tolist() == [0.3, 0.15, 0.5]
    store.close()
