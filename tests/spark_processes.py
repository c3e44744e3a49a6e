"""The processes of a LocalCluster that tests kill: an application's executor JVMs."""

from __future__ import annotations


def executor_pids(cluster, app_id: str) -> list[int]:
    """The process ids of application `app_id`'s executor JVMs among `cluster`'s processes."""
    found = []
    for pid in cluster.pids():
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if "CoarseGrainedExecutorBackend" in cmdline and app_id in cmdline:
            found.append(pid)
    return found
