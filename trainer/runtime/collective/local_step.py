"""The local-gradients train step around Keras's own, as TensorFlow and torch run it: one all-reduce a step.

Each process runs Keras's OWN ``train_step`` on its rows (the forward pass,
the loss, the gradients, the loss tracker and the compiled metrics, as Keras
wrote them), with the optimizer's update held back (`HeldApply`). Then ONE
sum all-reduce per dtype carries, concatenated, everything the processes must
agree on (`Collect`):

* the gradients, averaged (``/ N``) and handed to Keras's own held
  ``optimizer.apply`` (loss scaling, clipping, weight decay, EMA, gradient
  accumulation as compiled): with equal local batches, the mean of the local
  mean gradients is the global batch's, so the step is plain Keras's on the
  global batch within float tolerance;
* the float non-trainable variables the step wrote (BatchNormalization's
  moving statistics), averaged;
* the metric variables' increments, summed: the logs cover the global batch.
  They ride in the gradients' all-reduce at no extra cost (the metrics read
  ``y_pred``, computed before Keras's update in its own step too).

Each process's random seeds are offset by its index during the step
(`SEED_STRIDE`, taken back after), so it draws its own dropout masks, as over
one global batch. What differs from one process: BatchNormalization
normalizes by the local batch (as under DDP without SyncBatchNorm). The JAX
step (`jax_group`) does the same inside ``jax.shard_map``.
"""

from __future__ import annotations

from typing import Any, Callable

#: The name of a Keras ``SeedGenerator``'s state variable ([seed, counter], advanced by [0, 1] per draw).
SEED_STATE = "seed_generator_state"
#: How far apart the processes' seeds are (an odd 32-bit constant: distinct for any number of processes).
SEED_STRIDE = 0x9E3779B1
GRAD, MEAN, SUM = "grad", "mean", "sum"


def has_keras_train_step(model) -> bool:
    """Whether `model` trains with Keras's own ``train_step`` (the local step wraps only that one)."""
    import keras

    return getattr(type(model), "train_step", None) is keras.Model.train_step


def is_seed_state(variable) -> bool:
    return variable.path.endswith(SEED_STATE)


def is_float(dtype) -> bool:
    return "float" in str(dtype)


class HeldApply:
    """Within the block, ``optimizer.apply`` records its call instead of updating (``apply_gradients`` calls
    ``self.apply`` too): an instance attribute over the method, set past Keras's attribute tracking."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer
        self.grads: list | None = None
        self.variables: list | None = None
        self.calls = 0

    def __call__(self, grads, trainable_variables=None) -> None:
        self.calls += 1
        self.grads = list(grads)
        self.variables = None if trainable_variables is None else list(trainable_variables)

    def __enter__(self) -> "HeldApply":
        object.__setattr__(self.optimizer, "apply", self)
        return self

    def __exit__(self, *exc) -> bool:
        object.__delattr__(self.optimizer, "apply")
        return False


class Collect:
    """The tensors of one step's all-reduce, grouped by dtype: `add` each, `reduce` them, read `results`.

    The backend gives the three operations on its tensors: `flatten` (a tensor to 1-D), `concat` (1-D tensors
    to one) and `split` (one 1-D tensor into pieces of the given sizes, reshaped as the tensors added)."""

    def __init__(self, flatten: Callable, concat: Callable, split: Callable) -> None:
        self.flatten, self.concat, self.split = flatten, concat, split
        self.parts: dict[Any, list[tuple[str, int, Any]]] = {}

    def add(self, kind: str, index: int, tensor) -> None:
        self.parts.setdefault(tensor.dtype, []).append((kind, index, tensor))

    def reduce(self, all_reduce_sum: Callable) -> dict[str, dict[int, Any]]:
        """``{kind: {index: summed tensor}}`` after one `all_reduce_sum` per dtype."""
        out: dict[str, dict[int, Any]] = {GRAD: {}, MEAN: {}, SUM: {}}
        for items in self.parts.values():
            flat = self.concat([self.flatten(t) for _, _, t in items])
            total = all_reduce_sum(flat)
            for (kind, index, _), piece in zip(items, self.split(total, [t for _, _, t in items])):
                out[kind][index] = piece
        return out


def apply_summed(summed: dict[str, dict[int, Any]], optimizer, held, grads: list, means: list, metrics: list,
                 starts: list, mean_of: Callable) -> None:
    """Write one step's all-reduced tensors back (`Collect.reduce`'s result): the gradients' and the written
    non-trainables' means (`mean_of(total)`), each metric's start plus every process's increment, then the
    optimizer step `held` kept back, on the averaged gradients."""
    for i, total in summed[GRAD].items():
        grads[i] = mean_of(total)
    for i, total in summed[MEAN].items():
        means[i].assign(mean_of(total))
    for i, total in summed[SUM].items():
        metrics[i].assign(starts[i] + total)
    if held.calls:
        optimizer.apply(grads, held.variables)
