"""Elastic fits (``Trainer(num_workers=(min, max))``): workers leave and join a running fit.

The Spark test runs one fit in a driver process of its own
(tests/elastic_driver.py: its own cluster, with Spark's dynamic allocation on):
it starts on the executors Spark grants, a worker daemon added during epoch 1
joins it, one of the first two killed while it trains leaves it at once, the
other paused while it trains (hung) is dropped by the fit's heartbeat and its
executor released to Spark, and the fit ends with every row of every epoch
committed exactly once, as the server counted it per chunk, each process
keeping the model it built for its next chunks. Under each backend
(``-m backend``), an elastic fit on the session's cluster trains every row
once, each process keeping its model, with local SGD averaged by the server
(the kill, pause and join are the same Spark code whatever the backend and
algorithm: they run DOWNPOUR under TensorFlow only, to keep the backend
streams short; the rounds' leaves and joins are tests/test_elastic_local_sgd.py's). The rest needs no Spark: the options, the membership's
bookkeeping, the server's chunk accounting and admission, the floor, the
epochs' order at the callbacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import digits_model
from ps_fakes import client, ones, server, wait_for
from trainer import Trainer
from trainer.errors import ClusterCapacityError, OptionError
from trainer.fit.kinds import CHUNKS_PER_WORKER
from trainer.fit.epoch_callbacks import EpochCallbacks
from trainer.fit.membership import Membership
from trainer.options import FitOptions
from trainer.ps.members import SILENT_S
from trainer.spark.elastic_launch import COLD_GRACE_S, COLD_KILLS, ColdTasks, ElasticPolicy, Floor
from trainer.spark.launch import kill_task, newest_stage, run_job, running_tasks, tasks_launched
from trainer.ps import RemoteError

DRIVER = Path(__file__).with_name("elastic_driver.py")
#: Seconds from Spark's launch of a task to its Python code starting (``task_start``) on 2 busy cores: Spark learns
#: of a decommission asynchronously, and a task it launched on the drained executor just before started its Python
#: 1.3 s after the request in a CI run. Spark gives a decommissioning executor no task once it knows.
LAUNCH_LATENCY_S = 3.0


def test_num_workers_takes_min_and_max_and_refuses_what_cannot_be_elastic():
    options = FitOptions(num_workers=(2, 4))
    assert (options.elastic, options.num_workers, options.min_workers) == ((2, 4), 4, 2)
    assert options.algorithm.name == "downpour" and options.algorithm_choice.facts.elastic
    assert options.given("num_workers") == (2, 4)
    assert FitOptions(num_workers=(3, 3)).elastic is None  # min == max: a fixed fit of 3
    for bad in [(4, 2), (0, 2), (1, 2, 3), (1.0, 2)]:
        with pytest.raises(OptionError, match=r"\(min, max\)"):
            FitOptions(num_workers=bad)
    assert FitOptions(num_workers=(1, 2), algorithm="localsgd").elastic == (1, 2)  # averaged by the server
    for fixed_group in ("allreduce", "easgd", "sync"):  # every step's global batch, or every worker's round
        with pytest.raises(OptionError, match="asynchronous parameter-server"):
            FitOptions(num_workers=(1, 2), algorithm=fixed_group)
    with pytest.raises(OptionError, match="ps_shards"):
        FitOptions(num_workers=(1, 2), algorithm="downpour", ps_shards=2)
    with pytest.raises(OptionError, match="min_workers"):
        FitOptions(num_workers=(1, 2), min_workers=2)


def test_membership_counts_joins_and_leaves_and_caps_the_workers_training():
    changes = []
    members = Membership(2, epoch=lambda: 1, step=lambda: 7, on_change=changes.append)
    a, b, c = ({"host": "h", "pid": pid, "ready_s": 2.0} for pid in (1, 2, 3))
    assert members.admit(a) == 0
    members.heard({"event": "hello", "time": 1.0, "member": a})
    members.heard({"event": "hello", "time": 2.0, "member": b})
    assert members.admit(c) > 0 and members.admit(a) == 0  # two train: a third waits, a member's next task not
    assert members.idle() == 0
    members.heard({"event": "bye", "time": 3.0, "member": a})  # a's task ended: it stays, idle
    assert members.admit(c) == 0 and members.idle() == 1
    members.heard({"event": "hello", "time": 4.0, "member": c})
    members.heard({"event": "lost", "time": 5.0, "member": b})
    assert [(e["event"], e["worker"], e["workers_before"], e["workers_after"]) for e in members.timeline()] == [
        ("joined", "h:1", 0, 1), ("joined", "h:2", 1, 2), ("joined", "h:3", 2, 3), ("left", "h:2", 3, 2)]
    assert changes[:4] == members.timeline() and changes[0]["epoch"] == 1 and changes[0]["step"] == 7
    assert "ready in 2.0 s" in changes[0]["why"] and "left in epoch 2" in members.line(changes[-1])
    members.heard({"event": "beat", "time": 6.0, "member": a})  # heartbeats: a and c beat, c's stop (it hangs)
    members.heard({"event": "beat", "time": 6.0, "member": c})
    members.heard({"event": "beat", "time": 11.0, "member": a})
    silent = members.check(now=11.5)
    assert [(e["worker"], e["why"]) for e in silent] == [("h:3", "no heartbeat for 5 s (hung or cut off)")]
    assert members.admit(b) == 0  # the hung process no longer holds a place
    members.heard({"event": "beat", "time": 20.0, "member": c})  # it wakes
    back = members.timeline()[-1]
    assert back["event"] == "joined" and "heard again after 8.5 s away" in back["why"]
    members.heard({"event": "bye", "time": 21.0, "member": c, "heartbeat": True})  # a heartbeat's goodbye: no leave
    assert len(members.members) == 2
    d = {"host": "h", "pid": 4}  # a process that joins and is lost at once holds no place: the others go on
    capped = Membership(1)
    capped.heard({"event": "hello", "time": 1.0, "member": d})
    assert capped.admit(a) == 0.5
    capped.heard({"event": "lost", "time": 1.1, "member": d})
    assert capped.admit(a) == 0 and [e["event"] for e in capped.timeline()] == ["joined", "left"]


def test_a_decommissioned_executor_s_process_leaves_at_once_finishes_its_task_and_does_not_come_back():
    members = Membership(1)
    drained, other = {"host": "h", "pid": 1, "executor": "3"}, {"host": "h", "pid": 2, "executor": "4"}
    members.heard({"event": "hello", "time": 1.0, "member": drained})
    (left,) = members.retire({"3", "9"}, now=2.0)
    assert left["event"] == "left" and left["executor"] == "3" and "graceful" in left["why"]
    assert members.admit(other) > 0  # its running task still trains: it holds its place until its end
    members.heard({"event": "beat", "time": 3.0, "member": drained})  # it beats on, but is no member again
    assert not members.members and members.retire({"3"}) == []
    members.heard({"event": "bye", "time": 4.0, "member": drained})
    assert members.admit(other) == 0 and [e["event"] for e in members.timeline()] == ["joined", "left"]


def test_the_fit_stops_once_the_slots_stay_under_the_minimum_longer_than_the_timeout():
    slots = [0]
    events: list[dict] = []
    floor = Floor(lambda: slots[0], ElasticPolicy(min_workers=2, floor_timeout=0.2, max_retries=0), events)
    floor.check()  # under the minimum: noted, not yet fatal
    slots[0] = 2
    time.sleep(0.3)
    floor.check()  # back at the minimum in time: the clock starts again
    slots[0] = 1
    floor.check()
    time.sleep(0.3)
    with pytest.raises(ClusterCapacityError, match="fewer than the elastic fit's minimum of 2 workers.*resume_from"):
        floor.check()
    assert [e["event"] for e in events] == ["below_minimum", "below_minimum"]
    assert every_row_once({0: 64, 1: 65}, {0: 2, 1: 3}, 32) == []
    assert every_row_once({0: 64, 1: 65}, {0: 3, 1: 2}, 32) == ["chunk 0: 3 batches committed for 64 rows (2 expected)",
                                                               "chunk 1: 2 batches committed for 65 rows (3 expected)"]


@pytest.mark.timeout(20)
def test_only_the_last_tasks_all_cold_while_a_member_idles_are_killed_and_each_chunk_a_few_times():
    in_hand, idle = {3: {0}}, [1]
    cold = ColdTasks(lambda epoch: in_hand.get(epoch, set()), lambda: idle[0])
    running = {3: [(40, 0), (41, 2)]}  # chunk 0's task trains (it said HELLO), chunk 2's starts
    assert cold.pick(running, 0.0) == [] and cold.pick(running, 10.0) == []  # the slots are not idle
    in_hand[3] = set()  # chunk 0 is done: only the cold one is left
    running = {3: [(41, 2)]}
    assert cold.pick(running, 10.0) == []  # seen cold now: not yet
    idle[0] = 0
    assert cold.pick(running, 10.0 + COLD_GRACE_S) == []  # no member idles (the fit's first tasks all start)
    idle[0] = 1
    assert cold.pick(running, 11.0) == [] and cold.pick(running, 11.0 + COLD_GRACE_S) == [(3, 41, 2)]
    for attempt in range(COLD_KILLS):  # Spark may hand the re-run to the same starting executor
        cold.killed_one(3, 41 + attempt, 2)
        assert cold.pick({3: [(41 + attempt, 2)]}, 100.0 * (attempt + 1)) == []  # a killed task is not killed again
        re_run = {3: [(42 + attempt, 2)]}
        cold.pick(re_run, 100.0 * (attempt + 1))
        picked = cold.pick(re_run, 100.0 * (attempt + 1) + COLD_GRACE_S)
        assert picked == ([] if attempt == COLD_KILLS - 1 else [(3, 42 + attempt, 2)])


def test_the_server_counts_each_chunk_admits_up_to_the_maximum_and_fences_a_replaced_task():
    members = Membership(1)
    heard: list[str] = []

    def on_member(event):
        heard.append(event["event"])
        members.heard(event)

    with server(num_workers=2, on_member=on_member, admit=members.admit) as ps:
        one, two = ({"host": "h", "pid": pid} for pid in (1, 2))
        with client(ps, 0) as first:
            assert first.hello({"epoch": 0, "member": one})[1]["committed_batches"] == 0
            first.commit(ones(), {"epoch": 0, "batches": 3})
            with client(ps, 1) as second:  # the maximum (1) trains: a second process waits
                assert second.hello({"epoch": 0, "member": two})[1] == {"wait": 0.5}
            assert ps.chunks_in_hand(0) == {0} and ps.chunks_in_hand(1) == set()
            with client(ps, 0) as rerun:  # Spark re-runs chunk 0 (its process's next task: admitted)
                assert rerun.hello({"epoch": 0, "member": one})[1]["committed_batches"] == 3
                with pytest.raises(RemoteError, match="replaced: a newer task of worker 0 in epoch 0"):
                    first.commit(ones(), {"epoch": 0, "batches": 1})  # the old task can no longer commit
                rerun.commit(ones(), {"epoch": 0, "batches": 2})
                assert ps.chunks_in_hand(0) == {0}
                ps.drop_member("h:1")  # its process went silent (hung): it holds no chunk any more
                assert ps.chunks_in_hand(0) == set()
            ps.fence_task(17)  # the driver killed task attempt 17 (a cold task at the fit's end)
            with client(ps, 1) as killed:  # its Python worker finished starting anyway
                with pytest.raises(RemoteError, match="fenced: Spark task attempt 17 was killed"):
                    killed.hello({"epoch": 0, "member": two, "task": 17})
            assert ps.claimed_chunks(0) == 1
        assert ps.committed_batches(0, 0) == 5 and ps.committed_batches(1, 0) == 0
        assert wait_for(lambda: ps.chunks_in_hand(0) == set())  # its tasks ended
        assert ps.claimed_chunks(0) == 1 and ps.claimed_chunks(1) == 0  # the re-run took the same chunk again
        assert wait_for(lambda: heard == ["hello", "hello", "bye", "bye"])  # the waiting HELLO is not a member
        with client(ps, 1) as beating:  # a heartbeat is answered at once, with no center
            assert beating.hello({"heartbeat": True, "member": two}) == ([], {})
        assert wait_for(lambda: heard[-2:] == ["beat", "bye"])
    assert [(e["event"], e["worker"]) for e in members.timeline()] == [("joined", "h:1"), ("joined", "h:2")]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_an_elastic_fit_grows_and_shrinks_under_dynamic_allocation_and_trains_every_row_once(tmp_path):
    import keras  # the driver's backend is this run's (KERAS_BACKEND)

    out = tmp_path / "elastic.json"
    run = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True, timeout=540,
                         cwd=DRIVER.parent.parent)
    assert run.returncode == 0 and out.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    history = json.loads(out.read_text())
    disturbed = history["disturbed"]
    assert set(disturbed) == {"added", "killed", "paused", "woken", "decommissioned"}
    joined = [e for e in history["membership"] if e["event"] == "joined"]
    left = [e for e in history["membership"] if e["event"] == "left"]
    assert len(joined) >= 3 and all(e["ready_s"] > 0 for e in joined)  # two first executors, the added one
    assert any(e["time"] > disturbed["added"] for e in joined)
    lost = [e for e in left if "without a goodbye" in e["why"]]
    assert lost and 0 <= lost[0]["time"] - disturbed["killed"] < 5  # noticed in seconds, not Spark's timeout
    hung = [e for e in left if "no heartbeat" in e["why"]]  # dropped by the fit's heartbeat, released to Spark
    assert len(hung) == 1 and 0 <= hung[0]["time"] - disturbed["paused"] < SILENT_S + 3, left
    assert hung[0]["executor_released"] is True
    (drained,) = [e for e in left if "decommissioned" in e["why"]]  # told by Spark, not by a lost connection
    assert 0 <= drained["time"] - disturbed["decommissioned"] < 5, left
    # graceful: the chunk it was training when drained ended there, committed, and was not run again; no chunk
    # came to it after Spark knew (a task Spark launched just before the request starts its Python a moment later)
    last = [w for w in history["workers"] if w["member"] == drained["worker"]]
    assert last and max(w["task_start"] for w in last) < disturbed["decommissioned"] + LAUNCH_LATENCY_S
    running = max(last, key=lambda w: w["task_start"])
    rerun = [w for w in history["workers"] if (w["epoch"], w["chunk"]) == (running["epoch"], running["chunk"])
             and w["task_start"] > running["task_start"]]
    assert not rerun and running["spark_attempt"] == 0, rerun
    assert max(e["workers_after"] for e in history["membership"]) == 3
    assert {w["backend"] for w in history["workers"]} == {keras.backend.backend()}
    assert any(not w["first_in_process"] for w in history["workers"])  # a process's next chunk trains its model
    chunks = {(w["epoch"], w["chunk"]): w for w in history["workers"]}
    assert {epoch for epoch, _ in chunks} == {0, 1, 2, 3} and len(chunks) == 4 * CHUNKS_PER_WORKER * 3
    for epoch in range(4):
        records = [w for (e, _), w in chunks.items() if e == epoch]
        assert every_row_once({w["chunk"]: w["rows"] for w in records},
                              {w["chunk"]: w["committed_batches"] for w in records}, 32) == []
        assert sum(w["rows"] for w in records) == 3000
    assert [e["epoch"] for e in history["epochs"]] == [0, 1, 2, 3]
    for epoch in range(1, 4):  # an epoch's chunks start once one of the epoch before has begun (its model built)
        assert min(w["task_start"] for (e, _), w in chunks.items() if e == epoch) > min(
            w["model_built"] for (e, _), w in chunks.items() if e == epoch - 1)
    assert history["epochs"][-1]["loss"] < history["epochs"][0]["loss"]


@pytest.mark.spark
def test_a_tagged_job_s_status_counts_its_launched_tasks_lists_the_running_ones_and_a_killed_one_runs_again(
        spark, tmp_path):
    """What lets the next epoch's job start while a joiner's Python still starts (``one_begun``), and what moves
    a cold task at a fit's end (``ColdTasks``): its id, and a kill that Spark answers with a re-run."""
    import concurrent.futures

    def blocked_until(release: str):
        def task(batches):
            deadline = time.monotonic() + 60
            while not Path(release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            yield from batches
        return task

    def started(job_tag: str, tasks: int, release: Path):
        frame = spark.range(tasks).repartition(tasks).persist()  # as an elastic fit's chunks after its first epoch
        frame.count()
        return pool.submit(run_job, frame, None, blocked_until(str(release)),
                           "id long", description="tasks_launched test", barrier=False, job_tag=job_tag)

    def active(job_tag: str) -> int:
        stage = newest_stage(spark, job_tag)
        return stage.numActiveTasks if stage else 0

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = started("launched-all", 2, tmp_path / "a")  # 2 tasks, 2 slots: both launched while they run
        assert wait_for(lambda: tasks_launched(spark, "launched-all"), timeout=60)
        (tmp_path / "a").touch()
        assert len(job.result(timeout=60)) == 2
        job = started("launched-some", 3, tmp_path / "b")  # 3 tasks, 2 slots: one waits for a slot
        assert wait_for(lambda: active("launched-some") == 2, timeout=60)
        assert tasks_launched(spark, "launched-some") is False
        assert wait_for(lambda: len(running_tasks(spark, "launched-some") or []) == 2, timeout=30)
        (victim, partition), _ = running_tasks(spark, "launched-some")
        assert kill_task(spark, victim, "test: a cold task") is True
        # the killed task's slot frees once its Python worker is gone: the waiting task, or the re-run, takes it
        assert wait_for(lambda: {t for t, _ in running_tasks(spark, "launched-some") or []} - {victim}, timeout=60)
        (tmp_path / "b").touch()
        assert sorted(row.id for row in job.result(timeout=60)) == [0, 1, 2]  # the killed partition ran again
        assert tasks_launched(spark, "launched-some") is True  # done counts as launched
    assert tasks_launched(spark, "no-such-job") is False


def test_epochs_reach_the_callbacks_in_order_when_a_later_one_ends_first():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    class Server:  # what EpochCallbacks asks of the parameter server: each worker's last EPOCH_DONE, the center
        epochs_done: dict = {}

        def center(self):
            return model.get_weights()

        def direct(self, **directives):
            raise AssertionError(f"no callback asks for {directives}")

    class Seen(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(epoch)

    seen: list[int] = []
    callbacks = EpochCallbacks(model, [Seen()], num_workers=2, epochs=2, inline=True)
    server = Server()
    callbacks.start(server)
    for worker, epoch in ((0, 0), (0, 1), (1, 1)):  # epoch 1 ends while chunk 1 of epoch 0 still trains
        server.epochs_done[worker] = {"epoch": epoch, "logs": {"loss": 1.0}, "time": time.time()}
        callbacks.on_epoch_done(worker, epoch)
    assert seen == []
    callbacks.on_epoch_done(1, 0)
    assert seen == [0, 1]


@pytest.mark.spark
@pytest.mark.backend
@pytest.mark.timeout(300)
def test_an_elastic_local_sgd_fit_trains_every_row_once_under_this_backend_each_process_keeping_its_model(digits):
    import keras

    train, _ = digits
    fitted = Trainer(digits_model(0.005), num_workers=(1, 2), epochs=2, batch_size=32, algorithm="localsgd",
                     verbose=False).fit(train)
    assert "averaged by the parameter server" in fitted.history.algorithm, fitted.history.algorithm
    assert set(fitted.history.update_log["kind"]) == {"round"}
    records = fitted.history.workers
    assert {w["backend"] for w in records} == {keras.backend.backend()}
    assert any(not w["first_in_process"] for w in records)  # a process's next chunk trains the model it built
    for epoch in (0, 1):
        mine = [w for w in records if w["epoch"] == epoch]
        assert len(mine) == 2 * CHUNKS_PER_WORKER and sum(w["rows"] for w in mine) == 1500
        assert every_row_once({w["chunk"]: w["rows"] for w in mine},
                              {w["chunk"]: w["committed_batches"] for w in mine}, 32) == []
    assert fitted.history.epochs[-1]["loss"] < fitted.history.epochs[0]["loss"]


def every_row_once(chunk_rows: dict[int, int], committed: dict[int, int], batch_size: int) -> list[str]:
    """Problems with one epoch's accounting: each chunk's committed batches must cover its rows exactly once
    (`chunk_rows`: rows per chunk; `committed`: batches the server counted per chunk). Empty: every row once."""
    problems = []
    for chunk, rows in sorted(chunk_rows.items()):
        expected = -(-rows // batch_size)
        got = committed.get(chunk, 0)
        if got != expected:
            problems.append(f"chunk {chunk}: {got} batches committed for {rows} rows ({expected} expected)")
    return problems
