"""LocalSGD: all-reduce's periodic cadence by name, for links slower than a step's compute.

Each worker trains on its own rows with Keras's own steps, and every ``H``
steps the workers' weights are averaged in ONE all-reduce over the group on
the backend's own engine (``trainer.runtime.collective.averaging``): the link
carries ``1 / H`` of the per-step all-reduce's bytes, in bfloat16 half of that
again. The averaged delta moves the trainable weights as a Nesterov step with
momentum 0.5 over the averages (an outer optimizer, as SlowMo, Wang et al.
ICLR 2020, and DiLoCo, Douillard et al. 2023, use): on MNIST at 2 and 3
workers with 16 local steps it recovered most of the accuracy that plain
averaging lost in short runs (docs/algorithms.md). This is `AllReduce` with
other defaults (``period="auto"``, ``wire="bf16"``, ``outer_momentum=0.5``),
not an algorithm of its own: the same collective kind of fit, the
same epoch-end report to the driver, the same checkpoints and resume.

``H`` is sized by time (``period="auto"``): the first steps of a fit average
every step (a warm-up at the global step, as post-local SGD starts) while the
step and the average are timed; then ``H`` is the smallest period that keeps
the average under 5 % of the workers' time, bounded by ``max_period`` (16:
the local SGD literature kept its accuracy with up to 16 local steps, Lin et
al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.allreduce import AllReduce


@dataclass(frozen=True)
class LocalSGD(AllReduce):
    """Local steps on each worker, the weights averaged over the group every ``period`` steps.

    Example:
        >>> Trainer(model, algorithm=LocalSGD(), num_workers=4)               # period sized by time, bf16
        >>> Trainer(model, algorithm=LocalSGD(period=8, wire="fp32"), num_workers=4)

    Args:
        period: Integer or ``"auto"`` (default): steps between two averages (``AllReduce``'s `period`).
        max_period: Integer. The bound of an automatic period (default 16).
        wire: String. ``"bf16"`` (default) or ``"fp32"``: how the averaged deltas travel.
        outer_momentum: Float in [0, 1). The Nesterov momentum of the step the averaged deltas make (default
            0.5); 0 moves the weights by the averaged delta alone.
        lr_scaling: String. As `AllReduce`'s: ``"linear"`` (default) multiplies the compiled rate by the
            number of workers.
    """

    period: int | str = "auto"
    wire: str = "bf16"
    outer_momentum: float = 0.5

    name: ClassVar[str] = "localsgd"
