"""Spark, and only Spark: the embedded cluster, sessions for any master, and launching barrier stages.

    java           -- SPARK_HOME of the pyspark wheel and a usable Java runtime
    procs          -- process groups of the embedded cluster's daemons (/proc)
    local_cluster  -- LocalCluster: a real standalone master and workers on this machine
    session        -- spark_session(master): a SparkSession with this project's defaults
    launch         -- barrier stages: free slots, run_stage_with_retries, driver addresses, error summaries

It knows nothing about algorithms or Keras.
"""
