"""Hold a task's process to as many cores as Spark gave the task, whatever its Keras backend.

Thread-count variables are not enough: TensorFlow and OpenMP read theirs,
but XLA (the JAX backend) ignores them, and a JAX process meant to use one
core was measured at 1.6 cores on a 2-core machine and 3.5 on 16 cores.
Only CPU affinity holds every backend to its share, so a task with ``c``
cores pins its process (every thread of it, also those a reused Python
worker started for an earlier task) to ``c`` cores.

Which cores. Tasks of several executors may share a machine and none knows
the others, so a task *claims* cores: one lock file per core in a directory
shared by the machine's processes (``flock``). A claim lasts while its task
runs: `release_cores` gives it back when the task ends (a process that exits
or claims again drops it too). An idle Python worker that Spark keeps for a
later task must hold none: the next task of another process would step
around a core nobody uses and land on its sibling's (two workers on one
core, each at half speed). A task takes the free cores first; where every
core is claimed (more tasks than cores, time-shared on purpose) it takes
the least claimed ones, starting from its partition index, so that tasks
spread instead of piling onto core 0. The cores come from the set this
process may use at all (``os.sched_getaffinity``: a container's cpuset),
never beyond. Containers
on one host each have their own directory (their own /tmp): there the
partition index alone spreads them.

``TRAINER_CPU_AFFINITY=off`` leaves affinity alone (the thread variables
still apply).
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile

log = logging.getLogger("trainer")

ENV = "TRAINER_CPU_AFFINITY"
_ORIGINAL: frozenset[int] | None = None  # the cores this process could use before any claim
_HELD: list[int] = []  # lock file descriptors of the cores this process claimed
_SHARING = False  # whether the last claim found every core claimed and shares one


def sharing() -> bool:
    """True when this process's last `choose_cores` found every core claimed and time-shares its cores."""
    return _SHARING


def enabled() -> bool:
    """False when ``TRAINER_CPU_AFFINITY`` is off/0/false/no, or the platform has no affinity call."""
    return hasattr(os, "sched_setaffinity") and os.environ.get(ENV, "on").strip().lower() not in (
        "off", "0", "false", "no")


def _lock_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), f"trainer-cores-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _release() -> None:
    while _HELD:
        os.close(_HELD.pop())


def _claim(core: int, directory: str) -> bool:
    fd = os.open(os.path.join(directory, f"core-{core}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _HELD.append(fd)
    return True


def _pin(cores: set[int]) -> None:
    """Every thread of this process (and the threads it starts later) on `cores`."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that ended meanwhile
            pass


def release_cores() -> None:
    """Give back this process's claims and the cores it could use before them (its task has ended)."""
    global _SHARING
    _release()
    _SHARING = False
    if _ORIGINAL is not None and enabled():
        _pin(set(_ORIGINAL))


def choose_cores(count: int, hint: int = 0) -> list[int] | None:
    """Claim `count` cores for this process and pin it to them; the cores, or None when affinity is off.

    `hint` (the task's partition index) decides where the search starts when
    every core is claimed. Claiming again (a reused Python worker's next task)
    first releases what this process held.
    """
    global _ORIGINAL, _SHARING
    _SHARING = False
    if not enabled():
        return None
    if _ORIGINAL is None:
        _ORIGINAL = frozenset(os.sched_getaffinity(0))
    _release()
    allowed = sorted(_ORIGINAL)
    count = max(1, min(int(count), len(allowed)))
    if count == len(allowed):
        _pin(set(allowed))
        return allowed
    directory = _lock_dir()
    start = hint % len(allowed)
    order = allowed[start:] + allowed[:start]
    chosen = [core for core in order if len(_HELD) < count and _claim(core, directory)]
    if len(chosen) < count:  # every core is claimed: time-share, spread by the hint
        chosen += [core for core in order if core not in chosen][: count - len(chosen)]
        _SHARING = True
        log.debug("All %d cores are claimed; sharing cores %s", len(allowed), chosen)
    _pin(set(chosen))
    return sorted(chosen)
