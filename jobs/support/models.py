"""The jobs' models that need no Spark to build: the MNIST CNN (`build_cnn`), which `jobs/mnist.py`, the
overhead and GPU benchmarks (`benchmarks/profile_overhead.py`, `benchmarks/bench_gpu.py`) and the out-of-core and security
benchmarks train. Importing it starts no Keras backend and imports no pyspark."""

from __future__ import annotations

from trainer.lr_schedules import worker_learning_rate

LEARNING_RATE = 1e-3


def build_cnn(dropout: bool = True, steps: int | None = None):
    """The seed's MNIST CNN (conv32-conv32-maxpool-dense225-dense10, 1,048,853 parameters).

    By default with dropout after the pooling (0.25) and after the dense layer
    (0.5): no extra parameters. Without it the model overfits (training loss
    0.01 after 4 epochs) and stops at 98.6-98.7 % test accuracy; with it plain
    Keras measured 98.9-99.1 % after 4 epochs, hence the job's 6 epochs.
    ``dropout=False`` is the seed's model exactly. Adam at 1e-3; given the
    optimizer `steps` one worker plans, held for the first tenth and then
    cosine-decayed to a tenth of it (``trainer.lr_schedules``).
    """
    import keras  # deferred: trainer's quiet settings must be in place when TensorFlow starts

    after_pool = [keras.layers.Dropout(0.25)] if dropout else []
    after_dense = [keras.layers.Dropout(0.5)] if dropout else []
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        *after_pool,
        keras.layers.Flatten(),
        keras.layers.Dense(225, activation="relu"),
        *after_dense,
        keras.layers.Dense(10, activation="softmax"),
    ], name="mnist_cnn")
    rate = worker_learning_rate(LEARNING_RATE, 1, scaling="none", steps=steps)
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
