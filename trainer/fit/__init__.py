"""The driver side of one fit: ``Trainer(...).fit(df)`` from its options to the `FittedModel`.

    trainer.py         `Trainer`: the options of a fit (checked once, in ``__init__``) and `fit`
    plan.py            every check before cluster work, and the plan (model, frame, start weights)
    driver.py          the one driver of every kind of fit: server, stage, callbacks, checkpoints, history
    kinds.py           what differs between kinds: the parameter-server algorithms and the collective one
    stage.py           the barrier stage around the server: start, run with retries, close on any failure
    epoch_callbacks.py Keras callbacks on the driver at every epoch end
    checkpoints.py     the one atomic writer and the server's checkpoints
    progress.py        the driver's progress bar
    fitted.py          `FittedModel` (transform, evaluate, save/load) and `TrainingHistory`
"""
