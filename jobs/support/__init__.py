"""What the jobs share, outside the library.

    datasets   -- offline MNIST and electricity-demand loaders
    timeseries -- the forecasting jobs' recipe in Spark: invertible min-max scaling, lag windows, the last hours held out
    scaling    -- sessions, the plain-Keras baseline and result rows of the scaling jobs
    plain_keras -- plain Keras in fresh processes on a Spark task's cores (also the benchmarks' worker loop's base)
    models     -- the MNIST CNN and its learning rate
    target     -- time to a target metric, epoch by epoch
    tracking   -- the jobs' MLflow runs
    report     -- result files (JSON, CSV, markdown), tables and plots
    cli        -- argparse types and the Trainer options of the jobs' flags
    selection  -- the model-selection jobs' comparison of strategies and its reports
"""
