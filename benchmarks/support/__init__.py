"""What the benchmarks share, beside the jobs' support.

    worker_loop     -- the parameter-server worker and the all-reduce loop without Spark (bench_gpu, profile_overhead)
    ps_bench        -- the parameter server's loads and the raw loopback and echo it is compared with (bench_ps)
    queueing_model  -- the scale model's arithmetic: mean-value analysis of workers and server stations
"""
