"""Policy versions reach the generators: the trainer publishes each version it saves, a worker
loads the newest one recorded. Nothing here imports torch, so a worker that never trains can
load versions too.

A version is the folder `step-NNNNNN` the trainer saved: whole weights, or a LoRA adapter. A
generator asks for the form it loads (`Generator.load_weights`): an engine in the trainer's
process the merged tensors from the trainer's memory (`SavedVersion.tensors`: nothing written),
a worker's engine whole weights from disk (a LoRA version merged, in `step-NNNNNN-merged`), a
server an adapter that it serves under the version's name (`campaign-step-NNNNNN`), a generator
that wraps the trainer's own model nothing at all.

The disk stays bounded (`prune_versions`, after each recorded step): the newest
`keep_versions` versions stay, and those still in use: the newest, which a resume loads with its
optimiser state, and, when versions leave the process, the one before it, which a worker may
still be loading, and any a worker in flight samples from (a server may read its adapter
again). A merged copy is written in the policy's compute dtype only for a generator that loads
whole weights from disk (workers; a sharded trainer's engine), and removed once that engine has
loaded it, or, for workers, once two newer versions superseded it.
A folder is removed by renaming it to a `.trash.` name first, so a kill mid-removal leaves no
half of a version under a version's name; the next prune finishes the job.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.errors import UserError

if TYPE_CHECKING:
    from harness.llm import Generator
    from trainer.policy import Policy

# A server keeps the newest version and the one before it, for workers still sampling from it;
# their folders (a server may reread an adapter it evicted) and merged copies stay on disk.
ADAPTERS_KEPT = 2
# What a versions folder holds, by name: a version, its merged copy, the staging folder of a
# save (`.step-NNNNNN.XXXX`, trainer/policy.py) and a folder being removed.
_VERSION = re.compile(r"step-(\d+)(-merged)?")
_STAGING = re.compile(r"\.step-(\d+)(?:-merged)?\..+")
_TRASH = ".trash."


@dataclass(frozen=True)
class SavedVersion:
    """A policy version in `folder`, in the forms a generator loads (`harness.llm.Weights`)."""

    folder: Path
    step: int
    campaign_name: str
    # The trainer's policy, which writes the merged weights when a generator asks for them;
    # None for a version a worker found recorded (the trainer wrote them merged beside it).
    policy: Policy | None = None

    @property
    def name(self) -> str:
        return adapter_name(self.campaign_name, self.step)

    def model_folder(self) -> str:
        merged = merged_folder(self.folder)
        if self.policy is not None:
            if not self.policy.config.lora:
                return str(self.folder)
            # In the dtype the engine computes in (bf16 where the hardware has it): half the
            # bytes of the fp32 master weights, and nothing the engine would keep.
            return str(self.policy.save_merged(merged, dtype=self.policy.autocast_dtype))
        if not (self.folder / "config.json").exists() and merged.exists():
            return str(merged)  # a LoRA version: the trainer also wrote it merged
        return str(self.folder)

    def tensors(self, dtype: Any) -> Iterable[tuple[str, Any]] | None:
        return None if self.policy is None else self.policy.engine_weights(dtype)

    def adapter_folder(self) -> str:
        if not (self.folder / "adapter_config.json").exists():
            raise UserError(
                f"policy version {self.step} at {self.folder} holds full weights, and a server "
                "takes new versions only as LoRA adapters; train with --lora, or give the "
                "workers the transformers or vllm backend"
            )
        return str(self.folder.resolve())

    def supersedes(self, name: str) -> bool:
        step = _version_step(name, self.campaign_name)
        return step is not None and step <= self.step - ADAPTERS_KEPT


def publish(
    policy: Policy,
    generator: Generator | None,
    folder: Path,
    *,
    campaign_name: str = "",
    write_merged: bool = True,
) -> None:
    """Make `generator` sample from the policy's current weights, saved in `folder` (on a
    server, as an adapter named after `campaign_name`); with no generator (`vpo train
    --follow`), workers load the folder themselves, so a LoRA version is also written merged
    beside it when `write_merged` (not when they all sample from a server)."""
    if generator is None:
        if policy.config.lora and write_merged:
            policy.save_merged(merged_folder(folder), dtype=policy.autocast_dtype)
        return
    generator.load_weights(SavedVersion(folder, policy.step, campaign_name, policy))
    # The engine holds the weights now; the merged copy it read from (if any) is spent.
    remove_folder(merged_folder(folder))


def prune_versions(
    folder: Path, newest: int, keep: int, *, shared: bool, sampled_from: int | None = None
) -> list[str]:
    """Remove from `folder` what no one needs once version `newest` is recorded: versions
    older than the newest `keep` (0: none is removed) and not in use, merged copies not in
    use, and what a killed save or removal left. Returns the names removed.

    In use: the newest version (a resume loads it); with `shared` (versions leave this
    process: workers, a server) the one before it too, which a worker may still be loading;
    and every version from the one before `sampled_from` (`Store.version_at_oldest_claim`: a
    worker in flight samples from it, or from the one before when a version came while it
    loaded), since a server may read an adapter's folder again. Versions are contiguous, so
    the newest `keep` are the steps newest - keep + 1 .. newest; a folder of a later step is a
    save not yet recorded, and stays."""
    loading = newest - (ADAPTERS_KEPT if shared else 1)  # merged copies up to this may go
    sampled = loading if sampled_from is None else min(loading, sampled_from - 2)
    last_unneeded = min(newest - keep, sampled) if keep else 0  # and versions up to this
    removed = []
    for entry in _entries(folder):
        name = entry.name
        version, staging = _VERSION.fullmatch(name), _STAGING.fullmatch(name)
        if version is not None:
            step, merged = int(version[1]), version[2] is not None
            stale = step <= (loading if merged else last_unneeded)
        else:
            stale = name.startswith(_TRASH) or (staging is not None and int(staging[1]) <= newest)
        if stale and entry.is_dir() and not entry.is_symlink():
            remove_folder(entry)
            removed.append(name)
    return removed


def remove_folder(folder: Path) -> None:
    """Remove `folder` if it exists: renamed to a `.trash.` name at once (atomic), so a kill
    leaves it under that name for the next `prune_versions`, never half a version under its
    own; then deleted."""
    trash = folder.with_name(f"{_TRASH}{folder.name}.{secrets.token_hex(4)}")
    try:
        os.replace(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except FileNotFoundError:
        return []


def serve_adapter(generator: Generator, campaign_name: str, step: int, folder: Path) -> None:
    """Make an endpoint generator sample from the LoRA policy version `step` saved in `folder`:
    loaded into the server under the version's name (once, whichever worker comes first), with
    the campaign's versions older than the newest ADAPTERS_KEPT unloaded."""
    generator.load_weights(SavedVersion(folder, step, campaign_name))


def served_versions(generator: Any, campaign_name: str) -> dict[str, int]:
    """The campaign's policy versions the generator's server holds: adapter name -> step."""
    found = {name: _version_step(name, campaign_name) for name in generator.served_adapters()}
    return {name: step for name, step in found.items() if step is not None}


def check_trainable_endpoint(generator: Any) -> None:
    """Training from an endpoint needs the sampled token ids (only vLLM returns them) and a
    server that loads each new version as a LoRA adapter."""
    if generator.server != "vllm":
        raise UserError(
            f"training needs the sampled token ids, which only a vLLM server returns; "
            f"{generator.base_url} is served by {generator.server or 'an unknown server'}"
        )
    generator.check_adapters()


def adapter_name(campaign_name: str, step: int) -> str:
    return f"{safe_name(campaign_name)}-{step_name(step)}"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def merged_folder(folder: Path) -> Path:
    """Where the whole weights of the LoRA version in `folder` are written."""
    return folder.with_name(folder.name + "-merged")


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "campaign"


def _version_step(name: str, campaign_name: str) -> int | None:
    """The step of the campaign's version an adapter is named after; None for another's."""
    prefix = f"{safe_name(campaign_name)}-step-"
    digits = name[len(prefix) :]
    return int(digits) if name.startswith(prefix) and digits.isdigit() else None
