"""What the trusted side sets up for each sandbox slot before its fork server starts: a uid no
other slot on the machine holds, and control groups that count the candidate's memory (shared
memory and in-memory files included, which RLIMIT_AS does not see) and processes.

A uid is claimed with an advisory lock on a file named after it, held for the slot's life: two
sandboxes (two `vpo eval`s, two campaigns) never share a uid, so they never share per-uid process
quotas or kernel keyrings; the kernel drops the lock when the process dies, so a crashed
harness frees its uids. The slot's control groups are named after its uid, so a crashed
harness's leftovers are found and reused by the next holder.

Only a root harness gets either: without root the fork server isolates candidates in a user
namespace instead, and the outcomes say what was not applied.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UID_FIRST = 1_000_000_000  # far above the ranges distributions and container tools hand out
UID_COUNT = 1_000_000
_LOCKS = Path("/run/vpo-sandbox")  # root's: a user cannot pre-create the lock files
# Every uid this process has claimed: a process with one of them that outlives its sandbox is
# ours to answer for (other processes' sandboxes use the same range at the same time).
claimed_here: set[int] = set()


@dataclass
class Slot:
    """One worker slot's identity and control groups. `close` releases both."""

    uid: int | None
    # files the fork server opens: "procs" (a list, one per hierarchy), "memory_limit",
    # "memory_events", "pids_limit"; empty without control groups
    cgroup: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _lock: int | None = None
    _folders: list[Path] = field(default_factory=list)

    def close(self) -> None:
        """Remove the control groups (their processes are gone by now) and free the uid."""
        for folder in self._folders:
            _remove_group(folder)
        self._folders = []
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def claim_slots(count: int) -> list[Slot]:
    """`count` slots, each with a uid of its own and, where the host allows, control groups."""
    if os.geteuid() != 0:
        warning = "shared memory not counted against the memory limit: control groups need root"
        return [Slot(None, warnings=[warning]) for _ in range(count)]
    slots: list[Slot] = []
    hierarchies = _hierarchies()
    try:
        for uid, lock in _claim_uids(count):
            slot = Slot(uid, _lock=lock)
            slots.append(slot)
            _add_groups(slot, hierarchies)
    except BaseException:
        for slot in slots:
            slot.close()
        raise
    return slots


def _claim_uids(count: int) -> list[tuple[int, int]]:
    _LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    claimed: list[tuple[int, int]] = []
    # the lowest free ones: the lock files then number no more than the most slots ever held
    # at once on this machine
    for uid in range(UID_FIRST, UID_FIRST + UID_COUNT):
        if len(claimed) == count:
            return claimed
        fd = os.open(_LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        claimed.append((uid, fd))
        claimed_here.add(uid)
    for _, fd in claimed:
        os.close(fd)
    raise RuntimeError(f"no free sandbox uid among {UID_COUNT:,}")


# ---------------------------------------------------------------------------------------------
# Control groups: v1's memory and pids controllers where they are mounted separately (as on
# this project's CI machines), else v2's, where this process's group delegates them.


@dataclass(frozen=True)
class _Hierarchy:
    version: int
    controllers: frozenset[str]  # of those we use: "memory", "pids"
    parent: Path  # this process's own group in it; slots' groups go below


def _hierarchies() -> list[_Hierarchy] | str:
    """Where to create the slots' groups, or why nowhere."""
    mounts: dict[str, tuple[str, set[str]]] = {}  # mount point -> (fstype, options)
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            after = fields.index("-")
            fstype, options = fields[after + 1], set(fields[after + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                mounts[fields[4]] = (fstype, options | set(fields[5].split(",")))
    own: dict[str, str] = {}  # controller ("" for v2) -> this process's group path
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    found: list[_Hierarchy] = []
    wanted = {"memory", "pids"}
    for point, (fstype, options) in mounts.items():
        if fstype == "cgroup":
            mine = wanted & options
            if mine:
                path = own.get(sorted(mine)[0], "/")
                found.append(_Hierarchy(1, frozenset(mine), _inside(Path(point), path)))
    v1 = set().union(*(h.controllers for h in found)) if found else set()
    if "memory" not in v1:
        for point, (fstype, _) in mounts.items():
            if fstype == "cgroup2" and "" in own:
                parent = _inside(Path(point), own[""])
                usable = _delegated(parent, wanted - v1)
                if usable:
                    found.append(_Hierarchy(2, frozenset(usable), parent))
                break
    if not any("memory" in h.controllers for h in found):
        return "no memory control group is available to this process"
    return found


def _inside(mount: Path, path: str) -> Path:
    # inside a cgroup namespace the mount's root is our group already
    candidate = mount / path.lstrip("/")
    return candidate if candidate.is_dir() else mount


def _delegated(parent: Path, wanted: set[str]) -> set[str]:
    """Controllers of `wanted` that groups below `parent` get (enabling them if we may)."""
    try:
        available = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        missing = (wanted & available) - enabled
        if missing:  # refused (EBUSY) when our own group holds processes, unless it is the root
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError:
        return set()
    return wanted & enabled


def _add_groups(slot: Slot, hierarchies: list[_Hierarchy] | str) -> None:
    if isinstance(hierarchies, str):
        slot.warnings.append(f"shared memory not counted against the memory limit: {hierarchies}")
        return
    for hierarchy in hierarchies:
        folder = hierarchy.parent / f"vpo-sandbox-{slot.uid}"
        try:
            _fresh_group(folder)
        except OSError as exc:
            what = "shared memory not counted" if "memory" in hierarchy.controllers else "pids"
            slot.warnings.append(f"{what}: cannot create control group {folder}: {exc.strerror}")
            continue
        slot._folders.append(folder)
        slot.cgroup.setdefault("procs", []).append(str(folder / "cgroup.procs"))
        if "memory" in hierarchy.controllers:
            v1 = hierarchy.version == 1
            limit, events = (
                ("memory.limit_in_bytes", "memory.oom_control")
                if v1
                else ("memory.max", "memory.events")
            )
            slot.cgroup["memory_limit"] = str(folder / limit)
            slot.cgroup["memory_events"] = str(folder / events)  # both count "oom_kill N"
        if "pids" in hierarchy.controllers:
            slot.cgroup["pids_limit"] = str(folder / "pids.max")


def _fresh_group(folder: Path) -> None:
    """Create `folder`, or empty the one a crashed holder of this uid left behind."""
    try:
        folder.mkdir()
        return
    except FileExistsError:
        pass
    for text in (folder / "cgroup.procs").read_text().split():
        try:
            os.kill(int(text), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove_group(folder: Path) -> None:
    for _ in range(50):  # killed processes leave their group a moment after they die
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
