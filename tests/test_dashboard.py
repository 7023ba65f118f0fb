"""The dashboard's API over a small real campaign, on SQLite and PostgreSQL: what the page draws,
how it stays current while a campaign writes, and that nothing it serves can write or run."""

from __future__ import annotations

import http.client
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, read_only_folder, start_vpo
from fastapi.testclient import TestClient
from sqlalchemy import insert

from harness.observation import status
from harness.observation.dashboard import Dashboard
from harness.observation.web import create_app, is_loopback, request_host
from harness.records import CandidateRecord, Lineage, NewGroup, NewProgram, RolloutRecord
from harness.store import Store
from harness.store.models import Program, RolloutGroup, Score, Trajectory


@pytest.fixture
def client(database: str) -> TestClient:
    store = Store.open(database, read_only=True)
    yield TestClient(create_app(store))
    store.close()


def test_overview_draws_what_the_database_holds(client: TestClient) -> None:
    o = client.get("/api/overview").json()
    assert o["campaign"]["name"] == "c" and o["objectives"] == ["a", "b"]
    assert o["programs"] == 5 and o["valid_programs"] == 4 and o["iterations"] == 2
    assert o["counts"] == {"ok": 4, "invalid": 0, "error": 1, "timeout": 0}
    assert o["tokens"] == 9  # three rollouts of three tokens
    assert o["best"]["a"] == {"program_id": 5, "score": 0.95, "raw": 9.5, "record": None}
    assert o["best"]["b"]["program_id"] == 3
    # Records: each valid program that beat every earlier one, numbered among valid programs.
    assert o["records"]["a"] == [[1, 1, 0.5], [2, 2, 0.9], [4, 5, 0.95]]
    assert o["records"]["b"] == [[1, 1, 0.5], [3, 3, 0.9]]
    (front,) = o["fronts"]
    assert (front["x"], front["y"]) == ("a", "b")
    assert front["points"] == [[5, 0.95, 0.2], [1, 0.5, 0.5], [3, 0.1, 0.9]]
    assert sorted(p[0] for p in o["cloud"]) == [1, 2, 3, 5]
    assert o["progress"]["programs"][-1][1] == 5
    assert [t[1] for t in o["progress"]["tokens"]] == [6, 9]


def test_overview_draws_pool_diversity_and_parse_rate_per_iteration(client: TestClient) -> None:
    """Iteration 0's slots with a program: A (0.9, 0.1), B (0.1, 0.9), the failed C (0, 0):
    diversity (1.6 + 1 + 1) / 3; iteration 1 has one program, so no diversity. Every rollout
    parsed as a whole ("ok")."""
    m = client.get("/api/overview").json()["measures"]
    assert m["window"] == 20 and m["iteration"] == [0, 1]
    assert m["pool_diversity"] == [pytest.approx(1.2), None]
    assert m["pool_diversity_mean"] == [pytest.approx(1.2), pytest.approx(1.2)]
    assert m["parse_rate"] == m["parse_rate_mean"] == [1.0, 1.0]


def test_measures_follow_new_and_late_groups(database: str) -> None:
    """A new iteration shows on the next read; a group committed below the highest group id
    read (concurrent workers on PostgreSQL) is not lost, and one written without its measures
    is measured from its rollouts."""
    writer = Store.open(database)
    reader = Store.open(database, read_only=True)
    live = Dashboard(reader).view(None)
    try:
        assert live.overview()["measures"]["iteration"] == [0, 1]
        unparsed = CandidateRecord(1, "unparsed", reason="no candidate 1")
        rollout = RolloutRecord("", [], None, "stop", "none", None, [unparsed])
        writer.record_iteration(1, NewGroup(2, 0, 1, (), [], None, [rollout]))
        m = live.overview()["measures"]
        assert m["iteration"] == [0, 1, 2] and m["parse_rate"] == [1.0, 1.0, 0.0]
        assert m["parse_rate_mean"][-1] == pytest.approx(2 / 3)
        for group_id, iteration in ((100, 4), (50, 3)):  # each its own commit
            with writer.engine.begin() as connection:
                connection.execute(
                    insert(RolloutGroup),
                    [
                        {
                            "id": group_id,
                            "campaign_id": 1,
                            "iteration": iteration,
                            "parent_program_id": 1,
                        }
                    ],
                )
                connection.execute(
                    insert(Trajectory),
                    [
                        {
                            "group_id": group_id,
                            "completion": "",
                            "token_ids": [],
                            "parse_status": "partial",
                            "candidates": [{"index": 1, "outcome": "new", "program_id": 2}],
                        }
                    ],
                )
            seen = live.overview()["measures"]
        assert seen["iteration"] == [0, 1, 2, 3, 4]
        assert seen["parse_rate"] == [1.0, 1.0, 0.0, 0.0, 0.0]
        assert seen == Dashboard(reader).view(None).overview()["measures"]
        # The rejected candidates, counted as groups arrive, are what a fresh count finds.
        shown = live.overview()["status"]
        fresh = status.report(reader, reader.campaigns()[0])
        assert shown["rejections"] == fresh["rejections"] and shown["rejections"]["unparsed"] == 3
        assert shown["candidates"] == fresh["candidates"] == 9
    finally:
        writer.close()
        reader.close()


def test_overview_says_how_it_is_going_and_has_each_training_metric(database: str) -> None:
    """Iterations, pace and rejected candidates as `vpo status` counts them, and every number
    a training step stored, per step (a missing staleness is left out, not drawn as 0)."""
    metrics = {"loss": 0.5, "kl": 0.001, "grad_norm": 2.0, "clip_fraction": 0.25}
    with Store.open(database) as writer:
        for step in (1, 2):
            writer.record_train_step(
                1,
                step=step,
                path=f"s{step}",
                metrics={**metrics, "step": step, "set_score": step / 10, "staleness": None},
                group_ids=[step],
            )
    with Store.open(database, read_only=True) as store:
        o = TestClient(create_app(store)).get("/api/overview").json()
    s = o["status"]
    assert (s["iterations"], s["budget"], s["eta_s"], s["steps"]) == (2, None, None, 2)
    assert s["running"] is True and s["elapsed_s"] >= 0
    assert s["candidates"] == 6
    assert s["rejections"] == {
        "unparsed": 2,
        "duplicate": 0,
        "lazy": 0,
        "near": 0,
        "invalid": 0,
        "error": 1,
        "timeout": 0,
    }
    assert s["last_step"]["set_score"] == 0.2 and s["last_step"]["staleness"] is None
    assert o["training"] == [
        {"step": 1, **metrics, "set_score": 0.1},
        {"step": 2, **metrics, "set_score": 0.2},
    ]


def test_top_table(client: TestClient) -> None:
    by_mean = client.get("/api/top").json()
    assert [r["id"] for r in by_mean] == [5, 1, 2, 3]
    assert by_mean[0]["value"] == pytest.approx(0.575)
    assert [r["id"] for r in client.get("/api/top?objective=b&n=2").json()] == [3, 1]
    weighted = client.get("/api/top?weights=0,1").json()
    assert [r["id"] for r in weighted] == [3, 1, 5, 2]
    for query, message in [
        ("weights=1", "--weights needs 2 numbers"),
        ("weights=x,1", "weights must be numbers"),
        ("objective=c", "no objective 'c'"),
    ]:
        response = client.get(f"/api/top?{query}")
        assert response.status_code == 400 and message in response.json()["detail"]
    assert client.get("/api/top?n=0").status_code == 422


def test_program_page_keeps_untrusted_code_as_data(client: TestClient, hostile_code: str) -> None:
    hostile = client.get("/api/programs/4").json()
    assert hostile["code"] == hostile_code and hostile["status"] == "error"
    assert hostile["origin_detail"]["trajectory"]["position"] == 1
    child = client.get("/api/programs/5").json()
    assert child["parent_id"] == 2 and child["origin_detail"]["draft_ids"] == [3]
    assert "-    return 1\n+    return 11\n" in child["diff"]
    assert client.get("/api/programs/1").json()["diff"] is None
    lineage = client.get("/api/programs/5/lineage").json()
    assert [step["id"] for step in lineage["path"]] == [5, 2, 1]
    missing = client.get("/api/programs/99")
    assert missing.status_code == 404 and "no program 99" in missing.json()["detail"]
    assert client.get("/api/overview?campaign=9").status_code == 404


def test_a_record_above_the_best_known_is_drawn_as_one(database: str) -> None:
    """Scores are not clipped at 1: a program 20% over the best known value on `a` is the best,
    marked as a record, and tops the tables, live, over one that only matches it."""
    reader = Store.open(database, read_only=True)
    client = TestClient(create_app(reader))
    try:
        assert client.get("/api/overview").json()["best"]["a"]["record"] is None
        with Store.open(database) as writer:
            known = writer.add_program(1, NewProgram("x = 6\n", "ok", {"a": 1.0, "b": 1.0}, {}))
            record = writer.add_program(1, NewProgram("x = 7\n", "ok", {"a": 1.2, "b": 1.0}, {}))
        o = client.get("/api/overview").json()
        assert o["best"]["a"] == {
            "program_id": record,
            "score": 1.2,
            "raw": None,
            "record": "record: +20.0% over best known",
        }
        assert o["best"]["b"] == {"program_id": known, "score": 1.0, "raw": None, "record": None}
        assert o["records"]["a"][-2:] == [[5, known, 1.0], [6, record, 1.2]]
        assert o["fronts"][0]["points"][0] == [record, 1.2, 1.0]
        assert [r["id"] for r in client.get("/api/top?objective=a&n=2").json()] == [record, known]
        assert client.get("/api/top?n=1").json()[0]["scores"] == {"a": 1.2, "b": 1.0}
        assert client.get(f"/api/programs/{record}").json()["scores"] == {"a": 1.2, "b": 1.0}
    finally:
        reader.close()


def test_page_runs_no_inline_script_and_serves_nothing_writable(client: TestClient) -> None:
    page = client.get("/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    html = page.text
    assert html.count("<script") == 2
    for name in ("app.js", "search.js"):
        assert f'<script src="{name}" defer></script>' in html
        script = client.get(f"/{name}").text
        assert "innerHTML" not in script.replace("never through innerHTML", "")
        assert "eval(" not in script and "insertAdjacentHTML" not in script
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/overview").status_code == 405


def test_read_only_store_refuses_writes(database: str) -> None:
    store = Store.open(database, read_only=True)
    try:
        with pytest.raises(Exception, match="(?i)read.?only"):
            store.add_program(1, NewProgram("x = 1\n", "ok", {"a": 0.1, "b": 0.1}, {}))
    finally:
        store.close()
    with Store.open(database) as store:  # nothing was written
        assert len(store.programs(1)) == 5


def test_other_hosts_are_refused_when_bound_locally(database: str) -> None:
    store = Store.open(database, read_only=True)
    app = create_app(store, local_only=True)
    for base in (
        "http://127.0.0.1:8300",
        "http://localhost:8300",
        "http://127.0.0.2:8300",
        "http://127.0.1.1:8300",
        "http://[::1]:8300",
    ):
        assert TestClient(app, base_url=base).get("/api/campaigns").status_code == 200, base
    for base in ("http://attacker.example:8300", "http://10.0.0.1:8300", "http://0.0.0.0:8300"):
        rebound = TestClient(app, base_url=base).get("/api/campaigns")
        assert rebound.status_code == 400, base
    store.close()


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.2", "127.0.1.1", "127.255.255.254", "localhost", "LOCALHOST",
     "::1", "[::1]", "::ffff:127.0.0.1", "[::ffff:127.0.1.1]"],
)  # fmt: skip
def test_every_loopback_address_is_local(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    ["0.0.0.0", "::", "128.0.0.1", "10.0.0.1", "::2", "::ffff:10.0.0.1", "attacker.example",
     "localhost.attacker.example", "127.0.0.1.nip.io", ""],
)  # fmt: skip
def test_other_addresses_are_not_local(host: str) -> None:
    assert not is_loopback(host)


def test_host_header_without_port() -> None:
    assert request_host("127.0.0.2:8300") == "127.0.0.2"
    assert request_host("[::1]:8300") == "[::1]"
    assert request_host("[::1]") == "[::1]"
    assert request_host("localhost") == "localhost"


def _get(address: str, port: int, host: str) -> int:
    """The status of GET /api/campaigns at address:port naming `host` in its Host header,
    waiting for the server to start listening."""
    deadline = time.monotonic() + 60
    while True:
        connection = http.client.HTTPConnection(address, port, timeout=10)
        try:
            connection.request("GET", "/api/campaigns", headers={"Host": f"{host}:{port}"})
            return connection.getresponse().status
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            connection.close()


def test_ui_bound_to_another_loopback_address_still_checks_the_host(
    sqlite_database: str,
) -> None:
    """`vpo ui --host 127.0.0.2` is local like 127.0.0.1: it says so and refuses a request
    naming another host (DNS rebinding), while its own address is served."""
    port = free_port()
    process = start_vpo("ui", "--db", sqlite_database, "--host", "127.0.0.2", "--port", str(port))
    assert process.stdout is not None
    lines = [process.stdout.readline(), process.stdout.readline()]
    assert f"http://127.0.0.2:{port}/" in lines[1], lines
    assert _get("127.0.0.2", port, "127.0.0.2") == 200
    assert _get("127.0.0.2", port, "attacker.example") == 400
    process.terminate()
    out, _ = process.communicate(timeout=30)
    assert "anyone who can reach this port" not in "".join(lines) + out


@pytest.mark.parametrize(
    "path",
    [
        "/api/top?weights=inf,1",
        "/api/top?weights=1,inf",
        "/api/top?weights=nan,1",
        "/api/top?weights=1e999,1",
        "/api/top?weights=1e308,1e308",
        "/api/top?weights=-1,2",
        "/api/top?weights=0,0",
        "/api/top?weights=1,2,3",
        "/api/top?weights=",
        "/api/top?weights=1,,2",
        "/api/top?n=99999999999999999999",
        "/api/top?n=x",
        "/api/top?campaign=99999999999999999999",
        "/api/top?campaign=x",
        "/api/overview?campaign=99999999999999999999",
        "/api/overview?campaign=-1",
        "/api/programs/99999999999999999999",
        "/api/programs/9223372036854775808",
        "/api/programs/99999999999999999999/lineage",
        "/api/programs/-1",
        "/api/programs/0/lineage",
        "/api/programs/1.5",
        "/api/programs/x",
    ],
)
def test_bad_url_parameters_are_a_4xx_with_one_line(database: str, path: str) -> None:
    store = Store.open(database, read_only=True)
    try:
        response = TestClient(create_app(store), raise_server_exceptions=False).get(path)
    finally:
        store.close()
    assert 400 <= response.status_code < 500, (path, response.status_code, response.text)
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail and "\n" not in detail, detail


def test_dashboard_reads_a_database_on_a_read_only_mount(sqlite_database: str) -> None:
    """`vpo ui` opens the database read-only: on a mount where no -wal or -shm can be created
    it still serves every view."""
    folder = Path(sqlite_database).parent
    with read_only_folder(folder) as view:
        store = Store.open(str(view / Path(sqlite_database).name), read_only=True)
        try:
            client = TestClient(create_app(store))
            assert client.get("/api/overview").json()["programs"] == 5
            assert [r["id"] for r in client.get("/api/top?weights=0,1").json()] == [3, 1, 5, 2]
            assert client.get("/api/programs/5/lineage").json()["depth"] == 2
        finally:
            store.close()


def _add(store: Store, rng: random.Random, campaign: int, count: int) -> None:
    for _ in range(count):
        status = "ok" if rng.random() < 0.8 else "error"
        a, b = round(rng.random(), 2), round(rng.random(), 2)
        store.add_program(
            campaign,
            NewProgram(f"x = {rng.random()}\n", status, {"a": a, "b": b}, {"a": a * 10, "b": None}),
            Lineage(parent_id=1),
        )


def test_live_view_read_in_steps_equals_a_fresh_read(database: str) -> None:
    """A campaign writes while the dashboard refreshes; what it built from the new rows alone
    matches what a dashboard opened afterwards reads in one go."""
    writer = Store.open(database)
    reader = Store.open(database, read_only=True)
    live = Dashboard(reader).view(None)
    rng = random.Random(7)
    try:
        for batch in (3, 1, 17, 0, 40):
            _add(writer, rng, 1, batch)
            seen = live.overview()
            fresh = Dashboard(reader).view(None).overview()
            assert seen == fresh
            for weights in (None, [1.0, 3.0]):
                assert [r["id"] for r in live.top(weights=weights, n=20)] == [
                    r["id"] for r in Dashboard(reader).view(None).top(weights=weights, n=20)
                ]
        assert seen["programs"] == 5 + 61
    finally:
        writer.close()
        reader.close()


def test_a_program_committed_below_what_was_read_is_not_lost(sqlite_database: str) -> None:
    """PostgreSQL sequences can commit id 100 before id 99; the dashboard notices the count
    below its watermark changed and reads again."""
    writer = Store.open(sqlite_database)
    reader = Store.open(sqlite_database, read_only=True)
    live = Dashboard(reader).view(None)

    def insert_at(program_id: int, a: float) -> None:
        with writer.engine.begin() as connection:
            connection.execute(
                insert(Program),
                [
                    {
                        "id": program_id,
                        "campaign_id": 1,
                        "code": f"y = {program_id}\n",
                        "code_hash": f"h{program_id}",
                        "origin": "llm",
                        "status": "ok",
                    }
                ],
            )
            connection.execute(
                insert(Score),
                [
                    {"program_id": program_id, "objective": "a", "value": a, "raw": None},
                    {"program_id": program_id, "objective": "b", "value": 0.0, "raw": None},
                ],
            )

    try:
        insert_at(100, 0.3)
        assert live.overview()["programs"] == 6
        insert_at(50, 0.99)  # the late commit
        seen = live.overview()
        assert seen["programs"] == 7 and seen["best"]["a"]["program_id"] == 50
        assert seen == Dashboard(reader).view(None).overview()
    finally:
        writer.close()
        reader.close()


def test_ui_command_errors_are_one_line(sqlite_database: str, tmp_path) -> None:
    def ui(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harness.cli", "ui", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )

    missing = ui("--db", str(tmp_path / "none.db"))
    assert missing.returncode == 2 and "no database at" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    bad_port = ui("--db", sqlite_database, "--port", "70000")
    assert bad_port.returncode == 2 and "port 70000 is not between 1 and 65535" in bad_port.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = ui("--db", sqlite_database, "--port", str(port))
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    assert len(busy.stderr.strip().splitlines()) == 1


def test_versions_read_in_steps_equal_a_fresh_read(database: str) -> None:
    """The per-version table adds each new group's rows to those it kept (a 100k campaign is
    not read again at every poll) and ends where a fresh read of the same database does."""
    from harness.records import CandidateRecord, NewGroup, RolloutRecord

    rng = random.Random(3)
    with Store.open(database) as store:
        view = Dashboard(store).view(None)
        assert [row["step"] for row in view.overview()["versions"]] == [0]
        for step in (1, 2):
            version = store.record_train_step(
                1, step=step, path=f"s{step}", metrics={"step": step, "trained": 2},
                group_ids=[step],
            )  # fmt: skip
            for _ in range(2):
                iteration = store.iterations_done(1)
                a, b = rng.random(), rng.random()
                program = NewProgram(
                    f"def f():\n    return {iteration}\n", "ok", {"a": a, "b": b}, {}
                )
                rollout = RolloutRecord(
                    "t", [1], [-0.1], "stop", "ok", None, [CandidateRecord(1, "new", program)]
                )
                store.record_iteration(
                    1,
                    NewGroup(
                        iteration=iteration, island=0, parent_id=1, draft_ids=(),
                        prompt=[{"role": "user", "content": "p"}], prompt_token_ids=[1],
                        rollouts=[rollout], version=version,
                    ),
                )  # fmt: skip
                stepwise = view.overview()["versions"]
        fresh = Dashboard(store).view(None).overview()["versions"]
    assert stepwise == fresh
    assert [row["step"] for row in fresh] == [0, 1, 2]
    assert [row["groups"] for row in fresh] == [2, 2, 2] and all(
        row["changed"] for row in fresh[1:]
    )
