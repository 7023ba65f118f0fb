"""The genealogy page's data and a program's story, on real databases: the small campaign of
conftest (both engines) and a larger one past the page's limit."""

from __future__ import annotations

import random

from fastapi.testclient import TestClient

from harness.observation.genealogy import NEWEST, TOP_PER_OBJECTIVE, FamilyTree
from harness.observation.web import create_app
from harness.records import Lineage, NewProgram
from harness.store import Store


def _tree(url: str) -> tuple[Store, FamilyTree]:
    store = Store.open(url, create=False)
    return store, FamilyTree(store, store.campaigns()[-1].id)


def test_small_campaign_is_drawn_whole_with_its_best_paths(database: str) -> None:
    store, family = _tree(database)
    with store:
        view = family.view()
    assert (view["total"], view["shown"], view["sampled"], view["rule"]) == (5, 5, False, None)
    nodes = {n["id"]: n for n in view["nodes"]}
    assert {i: n["parent"] for i, n in nodes.items()} == {1: None, 2: 1, 3: 1, 4: 1, 5: 2}
    assert [nodes[i]["origin"] for i in (1, 2)] == ["seed", "llm"]
    assert nodes[4]["valid"] is False and nodes[5]["scores"] == [0.95, 0.2]
    # Seeds and migrants were sampled by no policy; the rollouts here by the base weights.
    assert nodes[1]["version"] == -1 and nodes[5]["version"] == 0
    # The best of a is D (program 5) through A; the best of b is B (program 3).
    assert view["best"]["a"] == {"id": 5, "score": 0.95, "is_seed": False, "path": [1, 2, 5]}
    assert view["best"]["b"]["path"] == [1, 3]
    # The group of iteration 1 showed B as a draft to the rollout that wrote D.
    assert view["draft_edges"] == [{"from": 3, "to": 5}] and view["drafts_total"] == 1
    # Leaves side by side in id order, a parent centred over its first and last child.
    assert [nodes[i]["x"] for i in (5, 3, 4)] == [0.0, 1.0, 2.0]
    assert nodes[2]["x"] == 0.0 and nodes[1]["x"] == (0.0 + 2.0) / 2
    assert view["islands"] == [0, 1]


def test_a_seed_still_best_is_said_so(tmp_path) -> None:
    store = Store.open(str(tmp_path / "seed.db"))
    campaign = store.create_campaign("s", "toy", {}, 0)
    seed = store.add_program(campaign, NewProgram("def f():\n    return 0\n", "ok", {"a": 0.5}, {}))
    store.add_program(
        campaign,
        NewProgram("def f():\n    return 1\n", "ok", {"a": 0.2}, {}),
        Lineage(origin="migration", parent_id=seed, island=1, generation=1),
    )
    view = FamilyTree(store, campaign).view()
    assert view["best"]["a"]["is_seed"] is True and view["best"]["a"]["path"] == [seed]
    store.close()


def _grow(store: Store, campaign: int, count: int, rng: random.Random) -> None:
    """`count` programs, each under a random earlier one, scores random."""
    ids = [p.id for p in store.programs(campaign)]
    for k in range(count):
        parent = rng.choice(ids)
        generation = next(p.generation for p in store.programs_by_ids([parent])) + 1
        valid = rng.random() > 0.1
        ids.append(
            store.add_program(
                campaign,
                NewProgram(
                    f"def f():\n    return {len(ids)}\n",
                    "ok" if valid else "error",
                    {"a": rng.random(), "b": rng.random()} if valid else {"a": 0.0, "b": 0.0},
                    {},
                ),
                Lineage(origin="migration", parent_id=parent, island=k % 3, generation=generation),
            )
        )


def test_past_the_limit_the_page_draws_the_rule_and_hangs_each_program_from_a_drawn_one(
    tmp_path,
) -> None:
    store = Store.open(str(tmp_path / "big.db"))
    campaign = store.create_campaign("big", "toy", {}, 0)
    store.add_program(
        campaign, NewProgram("def f():\n    return 0\n", "ok", {"a": 0.1, "b": 0.1}, {})
    )
    _grow(store, campaign, 400, random.Random(0))
    family = FamilyTree(store, campaign)
    view = family.view(limit=150)
    assert view["total"] == 401 and view["sampled"] and "150" in view["rule"]
    nodes = {n["id"]: n for n in view["nodes"]}
    assert view["shown"] == len(nodes) == 150  # the chosen parts fit under 150 here
    # Every best path and every objective's 10 best are drawn with all their ancestors.
    parents = {p.id: p.parent_id for p in store.programs(campaign)}
    for best in view["best"].values():
        assert all(i in nodes for i in best["path"])
    for objective in ("a", "b"):
        ranked = sorted(
            (p for p in store.programs(campaign) if p.status == "ok"),
            key=lambda p: (-p.scores[objective], p.id),
        )[:TOP_PER_OBJECTIVE]
        for p in ranked:
            walk = p.id
            while walk is not None:
                assert walk in nodes
                walk = parents[walk]
    newest = sorted(parents)[-NEWEST:]
    assert all(i in nodes for i in newest)
    # A drawn program hangs from its nearest drawn ancestor and counts the ones between.
    for node in nodes.values():
        walk, between = parents[node["id"]], 0
        while walk is not None and walk not in nodes:
            walk, between = parents[walk], between + 1
        assert (node["parent"], node["skipped"]) == (walk, between)
    assert any(n["skipped"] for n in nodes.values())
    # The same question gets the same drawing.
    assert family.view(limit=150) == view
    store.close()


def test_a_tree_read_in_steps_equals_a_fresh_read(tmp_path) -> None:
    store = Store.open(str(tmp_path / "steps.db"))
    campaign = store.create_campaign("steps", "toy", {}, 0)
    store.add_program(
        campaign, NewProgram("def f():\n    return 0\n", "ok", {"a": 0.1, "b": 0.1}, {})
    )
    rng = random.Random(1)
    family = FamilyTree(store, campaign)
    for _ in range(3):
        _grow(store, campaign, 40, rng)
        family.view()
    assert family.view() == FamilyTree(store, campaign).view()
    store.close()


def test_story_tells_what_the_rollout_was_shown_and_what_became_of_each_candidate(
    database: str,
) -> None:
    with Store.open(database, create=False) as store:
        assert store.story(1) is None  # the seed: no rollout wrote it
        story = store.story(2)
    assert story["iteration"] == 0 and story["prompt"] == [{"role": "user", "content": "improve"}]
    mine = [r for r in story["rollouts"] if r["this"]]
    assert len(mine) == 1 and mine[0]["policy_version"] == 0
    assert [(c["index"], c["outcome"], c["program_id"]) for c in mine[0]["candidates"]] == [
        (1, "new", 2),
        (2, "new", 3),
    ]
    assert mine[0]["candidates"][0]["scores"] == {"a": 0.9, "b": 0.1}
    (other,) = [r for r in story["rollouts"] if not r["this"]]
    failed, unparsed = other["candidates"]
    assert failed["program_id"] == 4 and failed["status"] == "error"
    assert unparsed["outcome"] == "unparsed" and unparsed["reason"] == "no candidate 2"


def test_tree_and_story_routes(database: str) -> None:
    with Store.open(database, create=False) as store:
        client = TestClient(create_app(store))
        tree = client.get("/api/tree").json()
        assert tree["total"] == 5 and len(tree["nodes"]) == 5
        assert client.get("/api/programs/5/story").json()["rollout"]["iteration"] == 1
        assert client.get("/api/programs/1/story").json()["rollout"] is None
        missing = client.get("/api/programs/99/story")
        assert missing.status_code == 404 and "no program 99" in missing.json()["detail"]
        for bad in ("/api/tree?limit=5", "/api/tree?limit=x", "/api/tree?campaign=7"):
            response = client.get(bad)
            assert response.status_code in (400, 404, 422)
            assert "\n" not in str(response.json()["detail"])
        assert client.get("/search.js").status_code == 200
