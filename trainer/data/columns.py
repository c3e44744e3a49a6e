"""The column names of the two-column frame a training stage reads (no pyspark here: the worker side
imports them too, `trainer.runtime.feeding.arrow` and `trainer.runtime.feeding.spill`)."""

FEATURES = "features"
LABEL = "label"
#: The boolean column that marks validation rows in a stage's frame.
VALIDATION_FLAG = "_is_validation"
