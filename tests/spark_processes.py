"""The JVMs of a LocalCluster, read from /proc: their command lines, and an application's executors (which
tests kill)."""

from __future__ import annotations


def java_cmdlines(pids: list[int]) -> dict[int, list[str]]:
    """The command line (its arguments) of each of `pids` that is a running JVM."""
    cmds = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() != "java":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                cmds[pid] = cmdline.read().decode(errors="replace").split("\0")
        except OSError:
            pass
    return cmds


def executor_pids(cluster, app_id: str) -> list[int]:
    """The process ids of application `app_id`'s executor JVMs among `cluster`'s processes."""
    return [pid for pid, cmd in java_cmdlines(cluster.pids()).items()
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and any(app_id in c for c in cmd)]
