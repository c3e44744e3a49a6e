"""Data-parallel training of Keras 3 models on Apache Spark DataFrames.

Public API:
    Trainer, FittedModel            -- trainer.estimator
    SingleWorker, SyncAveraging, DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD
                                    -- trainer.algorithms
    LocalCluster                    -- trainer.cluster
"""
