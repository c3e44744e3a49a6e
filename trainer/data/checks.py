"""Check a training DataFrame against a Keras model before any training starts.

`prepare_frame` resolves the feature and label columns, converts them to the
two-column layout the workers read (``features``: flat array<float>,
``label``: float or array<float>), and runs ONE Spark aggregation that counts
rows and finds bad values. Every problem raises `DataValidationError` with the
expected value, the received value and the fix, before the training job starts.

Checks (the README has the same table):
    missing or misspelled column      -> suggests the closest existing name
    wrong column type (string, map)   -> names the type and how to convert
    empty DataFrame / too few rows    -> counts
    null, NaN or inf in features/label
    feature size != model input size  -> both shapes
    labels out of range for the loss  -> range found and range expected
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from trainer.data.columns import FEATURES, LABEL
from trainer.errors import DataValidationError



@dataclass(frozen=True)
class DataSpec:
    """What the workers need to know to turn Arrow batches into numpy arrays."""

    num_rows: int
    feature_size: int
    input_shape: tuple[int, ...]  # per-sample shape the model takes
    label_size: int | None  # None: scalar label; k: array label of k values


# -- column resolution --------------------------------------------------------

def _column_type(df: DataFrame, name: str, role: str) -> T.DataType:
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name in fields:
        return fields[name]
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DataValidationError(
        f"The {role} column {name!r} is not in the DataFrame.{hint} "
        f"Available columns: {', '.join(fields) or '(none)'}. Pass {role}_col=<name>."
    )


def _is_vector(dtype: T.DataType) -> bool:
    return type(dtype).__name__ == "VectorUDT"


def _element_type(dtype: T.DataType) -> tuple[T.DataType, int]:
    depth = 0
    while isinstance(dtype, T.ArrayType):
        dtype, depth = dtype.elementType, depth + 1
    return dtype, depth


def _as_float_array(df: DataFrame, name: str, role: str) -> Column:
    """Column expression giving a flat array<float> for one input column."""
    from pyspark.ml.functions import vector_to_array

    dtype = _column_type(df, name, role)
    col = F.col(f"`{name}`")
    if _is_vector(dtype):
        return vector_to_array(col, "float32")
    element, depth = _element_type(dtype)
    if not isinstance(element, (T.NumericType, T.BooleanType)):
        raise DataValidationError(
            f"The {role} column {name!r} has type {dtype.simpleString()}; expected a number, an array "
            "of numbers or a Spark ML Vector. Convert it first (e.g. StringIndexer for string labels, "
            "F.col(...).cast('float') for numeric strings)."
        )
    for _ in range(depth - 1):
        col = F.flatten(col)
    if depth == 0:
        col = F.array(col)
    return col.cast(T.ArrayType(T.FloatType()))


def feature_column(df: DataFrame, features_col: str | Sequence[str]) -> Column:
    """A flat array<float> column from a vector/array column or a list of numeric columns."""
    if isinstance(features_col, str):
        return _as_float_array(df, features_col, "features")
    if not features_col:
        raise DataValidationError("features_col is an empty list; give a column name or a list of names.")
    parts = [_as_float_array(df, name, "features") for name in features_col]
    return F.concat(*parts) if len(parts) > 1 else parts[0]


def label_column(df: DataFrame, label_col: str) -> tuple[Column, bool]:
    """(expression, is_array) for the label: float for scalars, array<float> otherwise."""
    dtype = _column_type(df, label_col, "label")
    if _is_vector(dtype) or isinstance(dtype, T.ArrayType):
        return _as_float_array(df, label_col, "label"), True
    if not isinstance(dtype, (T.NumericType, T.BooleanType)):
        _as_float_array(df, label_col, "label")  # raises the type error
    return F.col(f"`{label_col}`").cast(T.FloatType()), False


# -- model facts ----------------------------------------------------------------

def model_io(model) -> tuple[tuple[int | None, ...], int | None, str]:
    """(input shape without batch dim, output units, canonical loss name) of a compiled model."""
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise DataValidationError(
            "The model is not compiled. Call model.compile(optimizer=..., loss=..., metrics=[...]) "
            "before training, or pass a function that returns a compiled model."
        )
    if getattr(model, "loss", None) is None:
        raise DataValidationError("The model was compiled without a loss. Provide `loss` in compile().")
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise DataValidationError(
            "The model has no defined input shape. Build it with an Input layer "
            "(keras.Input(shape=...)) so that feature sizes can be checked."
        )
    if len(inputs) != 1 or len(model.outputs) != 1:
        raise DataValidationError(
            f"Only single-input, single-output models are supported. Received: {len(inputs)} inputs, "
            f"{len(model.outputs)} outputs."
        )
    input_shape = tuple(inputs[0].shape[1:])
    out_shape = tuple(model.outputs[0].shape[1:])
    units = out_shape[-1] if out_shape else 1
    return input_shape, units, _loss_name(model.loss)


def _loss_name(loss) -> str:
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or getattr(loss, "__name__", "")
    return str(name).lower()


def resolve_input_shape(input_shape: tuple[int | None, ...], feature_size: int) -> tuple[int, ...]:
    known = math.prod(d for d in input_shape if d is not None)
    unknown = [i for i, d in enumerate(input_shape) if d is None]
    mismatch = DataValidationError(
        f"Each feature row has {feature_size} values but the model's input shape is "
        f"{_shape_str(input_shape)}. Reshape the features or change the model's Input(shape=...)."
    )
    if len(unknown) > 1 or known == 0:
        raise DataValidationError(
            f"Cannot map flat features of size {feature_size} onto the model input shape "
            f"{_shape_str(input_shape)} with more than one unknown dimension. Give the model a fixed shape."
        )
    if unknown:
        if feature_size % known:
            raise mismatch
        shape = list(input_shape)
        shape[unknown[0]] = feature_size // known
        return tuple(shape)
    if known != feature_size:
        raise mismatch
    return tuple(input_shape)  # type: ignore[return-value]


def _shape_str(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


# -- the one aggregation ------------------------------------------------------------

def _not_finite(col: Column, is_array: bool) -> Column:
    def bad(x: Column) -> Column:
        return x.isNull() | F.isnan(x) | (F.abs(x) == float("inf"))

    return (col.isNull() | F.exists(col, bad)) if is_array else bad(col)


def prepare_frame(
    df: DataFrame,
    features_col: str | Sequence[str],
    label_col: str | None,
    model,
    *,
    min_rows: int = 1,
    check_values: bool = True,
) -> tuple[DataFrame, DataSpec]:
    """Validate `df` for `model` and return (two-column frame, spec).

    The returned frame has columns ``features`` (array<float>) and, when
    `label_col` is given, ``label``. One Spark job is run for the counts.
    """
    input_shape, units, loss = model_io(model)
    features = feature_column(df, features_col)
    columns = [features.alias(FEATURES)]
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.min(F.size(FEATURES)).alias("min_size"),
        F.max(F.size(FEATURES)).alias("max_size"),
    ]
    label_is_array = False
    if label_col is not None:
        label, label_is_array = label_column(df, label_col)
        columns.append(label.alias(LABEL))
        lab = F.col(LABEL)
        if label_is_array:
            aggs += [F.min(F.size(LABEL)).alias("min_label_size"), F.max(F.size(LABEL)).alias("max_label_size")]
            aggs += [F.min(F.array_min(lab)).alias("label_min"), F.max(F.array_max(lab)).alias("label_max")]
        else:
            aggs += [F.min(lab).alias("label_min"), F.max(lab).alias("label_max")]
            # floor() of inf/NaN overflows under ANSI SQL: only finite labels are looked at here.
            fractional = F.when(~_not_finite(lab, False), lab != F.floor(lab)).otherwise(F.lit(False))
            aggs.append(F.sum(fractional.cast("long")).alias("fractional_labels"))
    if check_values:
        aggs.append(F.sum(_not_finite(F.col(FEATURES), True).cast("long")).alias("bad_features"))
        if label_col is not None:
            aggs.append(F.sum(_not_finite(F.col(LABEL), label_is_array).cast("long")).alias("bad_labels"))
    frame = df.select(*columns)
    stats = frame.agg(*aggs).first().asDict()

    rows = stats["rows"]
    if rows == 0:
        raise DataValidationError("The DataFrame is empty: there is nothing to train on or evaluate.")
    if rows < min_rows:
        raise DataValidationError(
            f"The DataFrame has {rows} rows but at least {min_rows} are needed (one per worker). "
            "Use fewer workers or more data."
        )
    if stats["min_size"] != stats["max_size"]:
        raise DataValidationError(
            f"Feature rows have different sizes (from {stats['min_size']} to {stats['max_size']} values). "
            "Every row must have the same number of features."
        )
    if stats.get("bad_features"):
        raise DataValidationError(
            f"{stats['bad_features']} of {rows} rows have null, NaN or infinite feature values. "
            "Drop or impute them first (e.g. df.na.drop(), pyspark.ml.feature.Imputer)."
        )
    if stats.get("bad_labels"):
        raise DataValidationError(
            f"{stats['bad_labels']} of {rows} rows have a null, NaN or infinite label. Drop or fix them first."
        )
    feature_size = int(stats["max_size"])
    shape = resolve_input_shape(input_shape, feature_size)
    label_size = None
    if label_col is not None:
        if label_is_array:
            if stats["min_label_size"] != stats["max_label_size"]:
                raise DataValidationError("Array labels have different sizes; every label must have the same size.")
            label_size = int(stats["max_label_size"])
        _check_labels(loss, units, stats, label_size)
    return frame, DataSpec(num_rows=rows, feature_size=feature_size, input_shape=shape, label_size=label_size)


def _check_labels(loss: str, units: int | None, stats: dict, label_size: int | None) -> None:
    low, high = stats["label_min"], stats["label_max"]
    if "sparse_categorical" in loss:
        if label_size is not None:
            raise DataValidationError(
                f"Loss {loss!r} expects one integer class index per row, but the label is an array of "
                f"{label_size} values. Use categorical_crossentropy for one-hot labels."
            )
        if stats.get("fractional_labels"):
            raise DataValidationError(f"Loss {loss!r} expects integer class labels; found fractional values.")
        if units and (low < 0 or high >= units):
            raise DataValidationError(
                f"Labels range from {low:g} to {high:g} but loss {loss!r} with {units} output units expects "
                f"class indices from 0 to {units - 1}. Re-index the labels or change the output layer."
            )
    elif loss.startswith("categorical") or loss == "categorical_crossentropy":
        if label_size is None or (units and label_size != units):
            raise DataValidationError(
                f"Loss {loss!r} expects one-hot labels of {units} values; received "
                f"{'scalar labels' if label_size is None else f'{label_size} values'}. "
                "Use sparse_categorical_crossentropy for integer labels."
            )
    elif "binary" in loss and (low < 0 or high > 1):
        raise DataValidationError(
            f"Loss {loss!r} expects labels between 0 and 1; labels range from {low:g} to {high:g}."
        )
    elif label_size is not None and units and label_size != units:
        raise DataValidationError(
            f"Each label has {label_size} values but the model outputs {units}. "
            "Change the output layer or the label column."
        )
