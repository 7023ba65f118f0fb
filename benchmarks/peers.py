"""OpenEvolve and ShinkaEvolve beside vpo-evolve, on the same problem, model and token budget.

    python benchmarks/peers.py [--harnesses openevolve,openevolve-full,shinka,vpo,vpo-train]
        [--problems oscillator1,bactgrow] [--seeds 0,1,2] [--token-budget 8000]
        (--base-url URL --model NAME | --serve [--model qwen-coder])
        [--temperature 0.8] [--top-p 0.95] [--max-tokens 1024] [--keep DIR [--resume]]
        [--out benchmarks/results/peers.md] [--plot benchmarks/results/peers.png]
    python benchmarks/peers.py --report-from DIR [--out FILE.md] [--plot FILE.png]

Harnesses, each a process of its own on each (problem, seed), one after another:

    openevolve  OpenEvolve 0.4.0, its LLM-SR example's configuration (benchmarks/peers/)
    openevolve-full  the same with whole programs for answers instead of SEARCH/REPLACE diffs
                (OpenEvolve's `diff_based_evolution: false`)
    shinka      ShinkaEvolve 0.0.7, its shinka_small.yaml
    vpo         `vpo run` with examples/demo.toml, no training
    vpo-train   the same with VPO in the loop (a LoRA step after every 2 groups)

Every harness gets the problem's statement and seed program (for the peers with the evolved
function between EVOLVE-BLOCK markers), and reaches the model only through a token-counting
proxy of its own (benchmarks/peers/peer_proxy.py) that writes the same temperature, top_p and
max_tokens over every request, counts completion tokens and model calls, and once the run has
spent --token-budget tokens refuses further requests; the benchmark then waits for the
evaluations in flight and stops the harness. The peers' evaluators call the project's scorer
(peer_score.py: `harness.evaluation.evaluate` in the sandbox), which logs every score; the
program each harness names as its best is scored again at the end. So every number here is the
project's scorer's, none a harness's own report.

Per harness and problem, mean [min, max] over seeds: the best score per objective among the
valid programs proposed within the budget, the hypervolume of their score vectors, the share of
proposals that were valid programs (a peer proposes one program per model call, vpo m per
rollout), tokens, model calls and wall time; and a plot of the best against tokens.
`--serve` starts `vllm serve` of --model (an embedded model's name by default) on 127.0.0.1
with the flags the trainer needs (log-probs as sampled, LoRA adapters loaded at run time), for
the duration. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks", ROOT / "benchmarks" / "peers"):
    sys.path.insert(0, str(_path))

from peer_harnesses import (  # noqa: E402
    PEERS,
    Launch,
    PeerInstallError,
    marked_seed,
    openevolve_best,
    openevolve_launch,
    peer_python,
    shinka_best,
    shinka_launch,
    vpo_best,
    vpo_launch,
)
from peer_proxy import Ledger, Sampling, proxy, upstream_root  # noqa: E402
from peer_results import PeerRun, peer_run, plot, report, scoring_open  # noqa: E402
from reporting import publish  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
HARNESSES = ("openevolve", "openevolve-full", "shinka", "vpo", "vpo-train")
QUIET_S = 3.0  # after the cut: no request, no evaluation started or ended, for this long
CUT_GRACE_S = 300.0  # after the cut, the longest wait for the work in flight
STOP_GRACE_S = 60.0  # for a harness to exit once asked (OpenEvolve saves its best then)
OWN_STOP_S = 1800.0  # for vpo to finish its last batch and step once its budget is spent
STALL_S = 1800.0  # without a model call beginning or ending, before the budget: a hung run
SERVE_READY_S = 900
SERVED_CONTEXT = 8192  # the peers' prompts hold several programs


def harness_launch(
    harness: str, problem: str, seed: int, url: str, args: argparse.Namespace, folder: Path
) -> Launch:
    if harness in ("vpo", "vpo-train"):
        return vpo_launch(
            harness, problem, seed, url, args.model, args.sampling, args.token_budget, folder
        )
    from problems.registry import load

    task = load(problem)
    seed_code = marked_seed(task.seed_program, task.entry)
    if harness == "shinka":
        return shinka_launch(
            args.pythons[harness], task.description, seed_code, problem, seed, url,
            args.model, args.sampling, folder,
        )  # fmt: skip
    return openevolve_launch(
        args.pythons[harness], task.description, seed_code, problem, seed, url,
        args.model, args.sampling, folder, diffs=harness == "openevolve",
    )  # fmt: skip


class RunFailed(Exception):
    """One harness's run that did not finish; the message says why in one line. The benchmark
    records it and goes on with the next run."""


def run_one(
    harness: str, problem: str, seed: int, args: argparse.Namespace, folder: Path
) -> PeerRun:
    """One harness on one problem and seed, behind a proxy of its own, to the budget."""
    folder.mkdir(parents=True)
    ledger = Ledger(args.token_budget, folder / "calls.jsonl")
    with proxy(args.base_url, ledger, args.sampling, os.environ.get(args.api_key_env or "")) as url:
        launch = harness_launch(harness, problem, seed, url, args, folder)
        started = time.time()
        with (folder / "harness.log").open("w") as log:
            process = subprocess.Popen(
                launch.command, cwd=launch.cwd, env=launch.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                watch(process, ledger, folder / "scores.jsonl", launch.stops_itself)
            finally:
                stop(process, launch.graceful)
        wall = time.time() - started
    # A peer is killed once its budget is spent; before that, or for vpo, an exit is a failure.
    if process.returncode not in (0, None) and (launch.stops_itself or not ledger.spent_out):
        raise RunFailed(
            f"{harness} seed {seed} on {problem} failed (exit {process.returncode}): "
            f"{tail(folder / 'harness.log')} (all of it: {folder / 'harness.log'})"
        )
    find = shinka_best if harness == "shinka" else vpo_best
    best = (openevolve_best if harness.startswith("openevolve") else find)(folder)
    return peer_run(harness, problem, seed, folder, args.token_budget, ledger, wall, best)


def watch(
    process: subprocess.Popen[bytes], ledger: Ledger, scores: Path, stops_itself: bool
) -> None:
    """Until the harness exits, or the budget is spent and the work in flight is done: no
    request in flight, no evaluation open, nothing new for QUIET_S (CUT_GRACE_S at most). A
    harness that `stops_itself` at the budget (vpo, storing its last batch and training on it)
    is waited for, OWN_STOP_S at most."""
    cut_at = None
    while process.poll() is None:
        time.sleep(0.5)
        if not ledger.spent_out:
            if time.time() - ledger.last_change > STALL_S:
                raise RunFailed(f"no model call began or ended for {STALL_S:.0f} s: stalled")
            continue
        now = time.time()
        cut_at = cut_at or now
        if stops_itself:
            if now - cut_at > OWN_STOP_S:
                return
            continue
        last = max(ledger.last_change, scores.stat().st_mtime if scores.exists() else 0.0)
        idle = ledger.in_flight == 0 and scoring_open(scores) == 0 and now - last > QUIET_S
        if idle or now - cut_at > CUT_GRACE_S:
            return


def stop(process: subprocess.Popen[bytes], graceful: bool) -> None:
    """SIGTERM (to the main process alone when `graceful`, else to its group), then SIGKILL to
    the whole group after STOP_GRACE_S; the group goes in any case (evaluations, workers)."""
    if process.poll() is None:
        try:
            if graceful:
                process.send_signal(signal.SIGTERM)
            else:
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def tail(log: Path, lines: int = 3) -> str:
    said = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " / ".join(said[-lines:]) or "nothing in its log"


def serve(model: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`vllm serve` of `model` (the folder `resolve_model` gives; served under the name
    `model`) on 127.0.0.1, with the sampling and LoRA flags of docs/scale.md's recipe."""
    import httpx

    from harness.llm.openai_backend import SERVER_FLAGS
    from trainer.models import preferred_dtype, resolve_model

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dtype = str(preferred_dtype("cpu")).split(".")[-1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", resolve_model(model), "--served-model-name", model,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
        "--max-model-len", str(SERVED_CONTEXT), *SERVER_FLAGS,
        "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
        "--enforce-eager", "--kv-cache-memory-bytes", str(4 << 30),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    with log.open("wb") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + SERVE_READY_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited: {tail(log)} (all of it: {log})")
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop(server, graceful=False)
    raise SystemExit(f"vllm serve was not ready in {SERVE_READY_S} s; its log: {log}")


def header(args: argparse.Namespace, seconds: float) -> list[str]:
    s = args.sampling
    where = "vllm serve started by the benchmark" if args.serve else f"at {args.base_url}"
    return [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
        "command: `python benchmarks/peers.py " + " ".join(sys.argv[1:]) + f"` "
        f"({seconds / 60:.0f} min in all)",
        f"model: {args.model} ({where}); every request sent with temperature {s.temperature}, "
        f"top_p "
        f"{s.top_p}, max_tokens {s.max_tokens}, no seed",
        f"budget: {args.token_budget} completion tokens per run; seeds "
        f"{', '.join(map(str, args.seeds))}",
        "best: the highest score per objective among the valid programs proposed within the "
        "budget (the seed's included); hypervolume of their score vectors above 0, over the "
        "objectives some run scored on; valid proposals: the share of the programs the model "
        "was asked for that the scorer scored; tokens and model calls as the proxy counted them "
        "(a request admitted before the budget was spent finishes); refused: requests after it; "
        "values mean [min, max] over seeds",
        f"plot: {args.plot.name}",
    ]


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, without the usage above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--harnesses", default=",".join(HARNESSES), help=f"of {', '.join(HARNESSES)}"
    )
    parser.add_argument(
        "--problems",
        default="oscillator1,bactgrow",
        help="equation_discovery problems (or any NAME:ARG), comma-separated",
    )
    parser.add_argument("--seeds", default="0,1,2", help="seeds, e.g. 0,1,2")
    parser.add_argument("--token-budget", type=int, default=8000, help="completion tokens a run")
    parser.add_argument("--base-url", help="the model's OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--api-key-env", default="", help="variable holding its key, if any")
    parser.add_argument("--model", default="qwen-coder", help="the model's name at the endpoint")
    parser.add_argument("--serve", action="store_true", help="start vllm serve of --model here")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-tokens", type=int, default=1024, help="per model call")
    parser.add_argument("--keep", type=Path, help="keep every run's folder (logs, databases) here")
    parser.add_argument("--report-from", type=Path, help="report the runs kept in DIR; run none")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on in --keep DIR: reuse each finished run, run again any a stop cut",
    )
    parser.add_argument(
        "--install", action="store_true", help="make the peers' environments (once) and exit"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "peers.md")
    parser.add_argument("--plot", type=Path, default=RESULTS / "peers.png")
    args = parser.parse_args(argv)
    args.harnesses = [h.strip() for h in args.harnesses.split(",") if h.strip()]
    unknown = [h for h in args.harnesses if h not in HARNESSES]
    if unknown or not args.harnesses:
        parser.error(f"--harnesses takes some of {', '.join(HARNESSES)}; got {unknown or 'none'}")
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes whole numbers separated by commas; got {args.seeds!r}")
    if args.token_budget <= 0:
        parser.error(
            f"--token-budget must be > 0 (every harness stops at it); got {args.token_budget}"
        )
    if args.max_tokens <= 0 or not 0 < args.top_p <= 1 or args.temperature < 0:
        parser.error("--max-tokens must be > 0, --top-p in (0, 1], --temperature >= 0")
    args.problems = [problem_name(p, parser) for p in args.problems.split(",") if p.strip()]
    if args.resume and args.keep is None:
        parser.error("--resume goes on with the runs kept in --keep DIR; give it")
    if args.keep is not None:  # the harnesses run in folders of their own: no relative path
        args.keep = args.keep.resolve()
    if args.report_from is None and not args.install:
        if args.serve == bool(args.base_url):
            parser.error("give the model's endpoint with --base-url URL, or --serve to start one")
        if args.base_url:
            try:
                upstream_root(args.base_url)
            except ValueError as error:
                parser.error(str(error))
    args.sampling = Sampling(args.temperature, args.top_p, args.max_tokens)
    return args


def problem_name(given: str, parser: argparse.ArgumentParser) -> str:
    """`oscillator1` is equation_discovery's; a problem that does not load is a parser error."""
    from problems.api import Problem
    from problems.registry import ProblemLoadError, load

    name = given.strip() if ":" in given else f"equation_discovery:{given.strip()}"
    try:
        problem = load(name)
    except ProblemLoadError as error:
        parser.error(f"--problems: {error}")
    if not isinstance(problem, Problem):
        parser.error(f"--problems: {name} is an answer problem; the harnesses evolve programs")
    return name


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.report_from:
        runs = [PeerRun.load(path) for path in args.report_from.glob("*/run.json")]
        if not runs:
            raise SystemExit(f"no run.json under {args.report_from}: was it kept by --keep?")
        order = {name: rank for rank, name in enumerate(HARNESSES)}
        runs.sort(key=lambda r: (r.problem, order.get(r.harness, len(order)), r.seed))
        args.serve, args.base_url = False, "(kept runs)"
        args.seeds = sorted({r.seed for r in runs})  # what was run, not what was typed
        args.token_budget = max(r.budget for r in runs)
        plot(runs, args.plot, f"best against tokens, {args.token_budget} tokens a run")
        publish(args.out, report(runs, header(args, sum(r.wall_s for r in runs))))
        return
    args.pythons = {}
    try:
        for harness in args.harnesses:
            if harness in PEERS:
                args.pythons[harness] = peer_python(PEERS[harness], say=print)
    except PeerInstallError as error:
        raise SystemExit(f"peers: {error}") from None
    if args.install:
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    started, server, runs = time.time(), None, []
    failures: list[str] = []  # runs that did not finish: recorded, never the benchmark's end
    args.kept_s = 0.0  # the wall clock of runs --resume kept from earlier sessions
    with tempfile.TemporaryDirectory(prefix="vpo-peers-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            if args.serve:
                server, args.base_url = serve(args.model, folder / "vllm-serve.log")
            # seed by seed, so that a session cut short leaves whole seeds of every problem
            for seed in args.seeds:
                for problem in args.problems:
                    for harness in args.harnesses:
                        try:
                            runs.append(one(harness, problem, seed, args, folder))
                        except RunFailed as failed:
                            label = f"[{problem} seed {seed} {harness}]"
                            print(f"{label} failed, going on: {failed}", file=sys.stderr)
                            failures.append(f"{problem} seed {seed} {harness}: {failed}")
        finally:
            if server is not None:
                stop(server, graceful=False)
    if not runs:
        raise SystemExit("every run failed: " + "; ".join(failures))
    plot(runs, args.plot, f"best against tokens, {args.token_budget} tokens a run, {args.model}")
    text = report(runs, header(args, time.time() - started + args.kept_s))
    if failures:
        text += "\n\nRuns that failed (left out of every table above):\n\n"
        text += "\n".join(f"- {line}" for line in failures) + "\n"
    publish(args.out, text)
    print(f"plot written to {args.plot}")


def one(harness: str, problem: str, seed: int, args: argparse.Namespace, folder: Path) -> PeerRun:
    label = f"[{problem} seed {seed} {harness}]"
    print(f"{label} starting", file=sys.stderr, flush=True)
    run_folder = folder / f"{problem.replace(':', '-')}-{harness}-seed{seed}"
    if args.resume and (run_folder / "run.json").exists():
        print(f"{label} kept: finished in an earlier session", file=sys.stderr, flush=True)
        kept = PeerRun.load(run_folder / "run.json")
        args.kept_s += kept.wall_s
        return kept
    if args.resume and run_folder.exists():  # cut before it finished: from the start
        print(f"{label} was cut before it finished; running it again", file=sys.stderr)
        shutil.rmtree(run_folder)
    if run_folder.exists():
        raise SystemExit(f"{run_folder} is already there; remove it, --keep elsewhere, or --resume")
    result = run_one(harness, problem, seed, args, run_folder)
    result.save(run_folder / "run.json")
    best = " ".join(f"{n} {v:.3f}" for n, v in zip(result.objectives, result.best(), strict=True))
    print(
        f"{label} done in {result.wall_s:.0f} s: {result.tokens} tokens, {result.calls} calls, "
        f"{result.refused} refused, valid {result.valid}/{result.proposals}, best {best}",
        file=sys.stderr,
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
