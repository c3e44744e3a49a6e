"""What the jobs share, outside the library.

    datasets   -- offline MNIST and electricity-demand loaders
    scaling    -- sessions, the plain-Keras baseline and result rows of the scaling jobs
    report     -- result files (JSON, CSV, markdown), tables and plots
    cli        -- argparse types and the Trainer options of the jobs' flags
    selection  -- the model-selection jobs' comparison of strategies and its reports
"""
