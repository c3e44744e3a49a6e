"""The scale model's arithmetic (trainer_benchmarks.support.queueing_model), checked against hand computations."""

from __future__ import annotations

import math

import pytest

from trainer_benchmarks.support.queueing_model import (
    GBIT,
    Cluster,
    Workload,
    allreduce_step_s,
    demands,
    knee,
    predict,
    predict_allreduce,
    with_codec,
)

MNIST = Workload(params=1_048_853, batch_s=1 / 30, window=5)


def test_one_worker_with_nothing_to_exchange_is_plain_keras():
    p = predict(Workload(10**6, 0.02, 5), Cluster(link_gbit=None), 1)
    assert p["speedup"] == pytest.approx(1.0)
    assert p["commits_per_s"] == pytest.approx(1 / (5 * 0.02))


def test_free_exchanges_scale_linearly():
    for n in (1, 7, 64):
        assert predict(Workload(10**6, 0.02), Cluster(link_gbit=None), n)["speedup"] == pytest.approx(n)


def test_one_worker_pays_every_cost_once():
    work = Workload(10**6, 0.02, window=5, worker_s=0.004, server_s=0.006)
    cluster = Cluster(link_gbit=10.0, latency_s=0.001)
    link = 4e6 / (10 * GBIT)  # 3.2 ms each way
    expected = 0.1 / (0.1 + 0.004 + 0.001 + 0.006 + 2 * link)
    assert predict(work, cluster, 1)["speedup"] == pytest.approx(expected)


def test_saturation_is_the_busiest_station():
    work = Workload(10**6, 0.02, window=5, server_s=0.010)
    p = predict(work, Cluster(link_gbit=None), 64)
    assert p["commits_per_s"] == pytest.approx(100.0, rel=1e-3)  # 1 / 10 ms
    assert p["speedup"] == pytest.approx(100 * 5 * 0.02, rel=1e-3)
    assert p["bottleneck"] == "server cpu"


def test_the_issues_10_gbe_example_knee_near_50_workers():
    # Issue 17: 4.2 MB in and out per commit on 10 GbE, ~30 batches/s, window 5, no server cost.
    d = 4 * 1_048_853 / (10 * GBIT)
    assert demands(MNIST, Cluster(link_gbit=10.0)) == pytest.approx({"server cpu": 0.0, "link in": d, "link out": d})
    assert 1 / d == pytest.approx(298, abs=1)  # commits/s one direction carries
    assert knee(MNIST, Cluster(link_gbit=10.0)) == pytest.approx((5 / 30 + 2 * d) / d)
    assert 50 < knee(MNIST, Cluster(link_gbit=10.0)) < 53


def test_codecs_shards_and_windows_move_the_knee():
    base = Cluster(link_gbit=1.0)
    assert with_codec(MNIST, "bf16").bytes_in == pytest.approx(MNIST.bytes_in / 2)
    assert with_codec(MNIST, "topk:0.01").compression == pytest.approx(0.02)
    assert with_codec(MNIST, "bf16").bytes_out == MNIST.bytes_out  # the reply stays dense
    # halving the commit leaves the reply as the busiest station: the knee barely moves
    assert knee(with_codec(MNIST, "bf16"), base) < knee(MNIST, base) * 1.01
    # compressed replies too: both links carry half, the knee (Z / d + 2) doubles past the two links
    both = with_codec(MNIST, "bf16", replies=True)
    assert both.bytes_out == pytest.approx(MNIST.bytes_out / 2)
    assert knee(both, base) - 2 == pytest.approx(2 * (knee(MNIST, base) - 2))
    four = demands(MNIST, Cluster(link_gbit=1.0, shards=4))
    assert four["link out"] == pytest.approx(demands(MNIST, base)["link out"] / 4)
    # knee = S * Z / d + 2 (two link stations of d / S each): S times as many workers past the two links
    assert knee(MNIST, Cluster(link_gbit=1.0, shards=4)) - 2 == pytest.approx(4 * (knee(MNIST, base) - 2))
    wide = Workload(MNIST.params, MNIST.batch_s, window=20)  # Z four times as long
    assert knee(wide, base) - 2 == pytest.approx(4 * (knee(MNIST, base) - 2))
    with pytest.raises(ValueError, match="none, fp16, bf16 or topk:F"):
        with_codec(MNIST, "zip")


def test_mva_two_workers_one_station_by_hand():
    # Z = 0.1, D = 0.05: n=1: R=0.05, X=1/0.15, Q=1/3; n=2: R=0.05*(4/3), X=2/(0.1+0.0667)
    p = predict(Workload(10**6, 0.02, window=5, server_s=0.05), Cluster(link_gbit=None), 2)
    assert p["commits_per_s"] == pytest.approx(2 / (0.1 + 0.05 * 4 / 3))


def test_shared_cores_time_share_the_workers():
    work = Workload(10**6, 0.02, window=5)
    two = predict(work, Cluster(link_gbit=None, cores=2), 2)["speedup"]
    three = predict(work, Cluster(link_gbit=None, cores=2), 3)["speedup"]
    assert two == pytest.approx(2.0) and three == pytest.approx(2.0, rel=1e-6)
    busy = Workload(10**6, 0.02, window=5, server_s=0.005)
    shared = predict(busy, Cluster(link_gbit=None, cores=2), 2)["speedup"]
    assert shared < predict(busy, Cluster(link_gbit=None), 2)["speedup"]  # the server takes from the workers' cores
    assert math.isinf(knee(work, Cluster(link_gbit=None)))
    with pytest.raises(ValueError, match="positive number of workers"):
        predict(work, Cluster(), 0)


def test_the_script_reads_measured_inputs_and_checks_itself_against_a_make_bench_run(tmp_path):
    import json

    from trainer_benchmarks.scale_model import main

    bench_ps = {"rows": [
        {"compression": "none", "params": 1_000_000, "shards": 1, "mac": "on", "ps_per_s": 250.0},
        {"compression": "none", "params": 1_000_000, "shards": 1, "mac": "off", "ps_per_s": 500.0},  # not as fits run
        {"compression": "none", "params": 10_000_000, "shards": 1, "mac": "on", "ps_per_s": 30.0},
    ]}
    overhead = {"metadata": {"limit": 1000, "batch_size": 100}, "rows": [
        {"setup": "plain", "epoch_s": 0.2},
        {"setup": "workers=1", "state_ms": 1.0, "payload_ms": 0.5, "load_ms": 1.5, "vs_plain": 0.9},
        {"setup": "workers=2", "vs_plain": 0.8},
    ]}
    mnist = {"rows": [
        {"workers": 0, "timing_valid": True, "throughput_vs_keras": None},
        {"workers": 1, "timing_valid": True, "throughput_vs_keras": 0.85},
        {"workers": 2, "timing_valid": True, "throughput_vs_keras": 0.75},
        {"workers": 4, "timing_valid": False, "throughput_vs_keras": 0.4},  # time-shared: not a check
    ]}
    paths = {}
    for name, data in (("bench_ps", bench_ps), ("overhead", overhead), ("mnist", mnist)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data), encoding="utf-8")
    png = tmp_path / "scale.png"
    assert main(["--bench-ps", str(paths["bench_ps"]), "--overhead", str(paths["overhead"]),
                 "--bench-mnist", str(paths["mnist"]), "--out", str(tmp_path / "out"), "--png", str(png)]) == 0

    result = json.loads((tmp_path / "out" / "scale_model.json").read_text(encoding="utf-8"))
    assert result["inputs"]["server_ms"] == pytest.approx(4.0)  # 1 / 250 commits/s, the MAC on
    assert result["inputs"]["worker_ms"] == pytest.approx(3.0)
    assert result["inputs"]["batch_ms"] == pytest.approx(20.0)  # 0.2 s over 10 batches
    bench = [c for c in result["validation"] if c["run"].startswith("make bench")]
    assert [(c["workers"], c["measured"]) for c in bench] == [(1, pytest.approx(0.85)), (2, pytest.approx(1.5))]
    one = predict(Workload(1_048_853, 0.020, 5, 0.003, 0.004), Cluster(link_gbit=None, cores=2), 1)["speedup"]
    assert bench[0]["model"] == pytest.approx(one)
    assert png.stat().st_size > 10_000


def test_allreduce_moves_2_n_minus_1_over_n_of_the_gradient_per_worker_per_step():
    work = Workload(10**6, 0.02)
    assert predict_allreduce(work, Cluster(link_gbit=10.0), 1)["speedup"] == pytest.approx(1.0)  # nothing to reduce
    ring = 2 * 3 / 4 * 4e6  # 4 workers: 6 MB per worker per step
    step = 0.02 + ring / (10 * GBIT) + 2 * 3 * 50e-6
    assert allreduce_step_s(work, Cluster(link_gbit=10.0), 4, hop_s=50e-6) == pytest.approx(step)
    p = predict_allreduce(work, Cluster(link_gbit=10.0), 4, hop_s=50e-6)
    assert p["speedup"] == pytest.approx(4 * 0.02 / step) and p["ring_bytes_per_worker"] == pytest.approx(ring)
    # no shared station: at 64 workers on 10 GbE the efficiency stays near batch / (batch + 8 * params / link)
    far = predict_allreduce(work, Cluster(link_gbit=10.0), 64)["efficiency"]
    assert far == pytest.approx(0.02 / (0.02 + 2 * 63 / 64 * 4e6 / (10 * GBIT)))
    assert far > predict(Workload(10**6, 0.02, window=5), Cluster(link_gbit=10.0), 64)["efficiency"]
    # loopback: only the hops; fewer cores than workers time-share the compute
    assert allreduce_step_s(work, Cluster(link_gbit=None, cores=2), 4, hop_s=1e-4) == pytest.approx(0.04 + 6e-4)
    with pytest.raises(ValueError, match="positive number of workers"):
        allreduce_step_s(work, Cluster(), 0)


def test_the_script_checks_allreduce_against_its_measured_runs(tmp_path):
    import json

    from trainer_benchmarks.scale_model import main

    measured = {"metadata": {"batch_size": 32},  # plain Keras under JAX: 1,600 samples/s, 20 ms per batch
                "rows": [{"workers": 0, "timing_valid": True, "throughput_vs_keras": None,
                          "samples_per_s_per_worker": 1600.0},
                         {"workers": 1, "timing_valid": True, "throughput_vs_keras": 0.95},
                         {"workers": 2, "timing_valid": True, "throughput_vs_keras": 0.9},
                         {"workers": 4, "timing_valid": False, "throughput_vs_keras": 0.4}]}
    path = tmp_path / "mnist.json"
    path.write_text(json.dumps(measured), encoding="utf-8")
    assert main(["--bench-allreduce", str(path), "--here-hop-us", "100", "--here-gbit", "20",
                 "--out", str(tmp_path / "out"), "--png", str(tmp_path / "scale.png")]) == 0
    result = json.loads((tmp_path / "out" / "scale_model.json").read_text(encoding="utf-8"))
    assert result["inputs"]["jax_batch_ms"] == pytest.approx(20.0)
    checks = [c for c in result["validation"] if c["run"].startswith("allreduce")]
    assert [(c["workers"], c["measured"]) for c in checks] == [(1, pytest.approx(0.95)), (2, pytest.approx(1.8))]
    step = 0.020 + 4 * 1_048_853 / (20 * GBIT) + 2 * 100e-6  # 2 workers: the whole gradient once, two hops
    assert checks[1]["model"] == pytest.approx(2 * 0.020 / step)
    ring = [r for r in result["predictions"] if r["scenario"] == "all-reduce"]
    assert {r["link_gbit"] for r in ring} == {1.0, 10.0, 100.0} and len(ring) == 3 * 64
    assert any(k["scenario"].startswith("all-reduce") for k in result["knees"])


def test_local_sgd_is_checked_against_the_labs_default_runs(tmp_path):
    from trainer_benchmarks.scale_model import LAB_BATCHES, LAB_GBIT, PARAMS, lab_checks
    from trainer_benchmarks.support.queueing_model import predict_local_sgd

    header = "link,job,model,asked,algorithm,workers,run,epoch_time_s,error\n"
    rows = ["1gbit,mnist,cnn,default,downpour,1,0,5.0,", "1gbit,mnist,cnn,default,downpour,1,1,7.0,",
            "1gbit,mnist,cnn,default,localsgd,2,0,3.0,", "1gbit,mnist,cnn,allreduce,allreduce,2,0,9.0,",
            "1gbit,mnist,cnn,default,localsgd,3,0,,boom", "1gbit,forecast,lstm,default,sync,2,0,1.0,",
            "9gbit,mnist,cnn,default,localsgd,2,0,1.0,"]  # a link whose rate is unknown: no check
    path = tmp_path / "bench-lab.csv"
    path.write_text(header + "\n".join(rows) + "\n", encoding="utf-8")
    (check,) = lab_checks(str(path), 2e-4, 3e-3)
    assert (check["workers"], check["measured"]) == (2, pytest.approx(6.0 / 3.0))  # the mean of the 1-worker runs
    work = Workload(PARAMS, 6.0 / LAB_BATCHES, 1)
    model = predict_local_sgd(work, Cluster(link_gbit=LAB_GBIT["1gbit"], cores=2), 2, 2e-4, 3e-3)["speedup"]
    assert check["model"] == pytest.approx(model) and check["model_vs_measured"] == pytest.approx(model / 2.0)
    assert check["within_1_25"] == (0.8 <= model / 2.0 <= 1.25)


def test_a_synchronous_group_moves_at_the_pace_of_its_most_crowded_core():
    from trainer_benchmarks.support.queueing_model import crowding, predict_local_sgd

    assert [crowding(n, 2) for n in (1, 2, 3, 4, 5)] == [1.0, 1.0, 2.0, 2.0, 3.0]
    assert crowding(64, None) == 1.0  # a core (or a machine) each
    work = Workload(10**6, 0.02, 1)
    # 3 workers on 2 cores: two share one core, and every average waits for them: no faster than 2 workers
    three = predict_local_sgd(work, Cluster(link_gbit=None, cores=2), 3)["speedup"]
    assert three == pytest.approx(3 * 0.02 / (2 * 0.02)) and three < 3 * 0.02 / (1.5 * 0.02)
    assert allreduce_step_s(work, Cluster(link_gbit=None, cores=2), 3) == pytest.approx(0.04)
