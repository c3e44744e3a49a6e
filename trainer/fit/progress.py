"""Driver-side progress bar fed by parameter-server updates (tqdm underneath).

Parameter-server threads call `update` with each update record; the bar shows
batches done over all workers, the epoch, the number of server updates and the
latest loss. It is thread-safe and a no-op when disabled.
"""

from __future__ import annotations

import threading


class TrainingProgress:
    def __init__(self, total_steps: int, num_workers: int, epochs: int, enabled: bool = True) -> None:
        from tqdm.auto import tqdm  # deferred: the worker side (make bench-gpu) runs without it

        self._lock = threading.Lock()
        self._steps = [0] * num_workers
        self._base = 0  # steps shown before the current attempt
        self._epochs = epochs
        self._updates = 0
        self._bar = tqdm(total=total_steps, unit="batch", desc="training", disable=not enabled, leave=True,
                         mininterval=1.0)

    def update(self, record) -> None:
        """Take one UpdateRecord (worker, step, epoch, loss) from the parameter server."""
        with self._lock:
            self._updates += 1
            worker = record.worker
            if record.step is not None and worker is not None and 0 <= worker < len(self._steps):
                self._steps[worker] = max(self._steps[worker], record.step)
            done = self._base + sum(self._steps)
            # Shared epochs can end a few batches past the planned total.
            self._bar.update(max(0, min(done, self._bar.total) - self._bar.n))
            postfix = {"epoch": f"{(record.epoch or 0) + 1}/{self._epochs}", "updates": self._updates}
            if record.loss is not None and record.loss == record.loss:
                postfix["loss"] = f"{record.loss:.4f}"
            self._bar.set_postfix(postfix, refresh=False)

    def note(self, line: str) -> None:
        """Print `line` above the bar (nothing when the bar is disabled)."""
        if not self._bar.disable:
            self._bar.write(line)

    def restart(self, num_workers: int) -> None:
        """A retried attempt (maybe on another number of workers) counts its steps from zero again:
        keep what was shown."""
        with self._lock:
            self._base += sum(self._steps)
            self._steps = [0] * num_workers

    def close(self) -> None:
        with self._lock:
            self._bar.close()
