"""A point's host work runs beside training (``pipeline.worker.HostWorker``): the real
pipeline, a real event sink whose point writes are held back, real event files."""

from __future__ import annotations

import threading

from tb_introspect import metadata
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.pipeline.worker import HostWorker
from tests.pipeline.pipeline_testlib import events as events_of
from tests.pipeline.pipeline_testlib import make, read, tensor, train

POINT_TAG = metadata.stats_tag("variable", "dense/kernel")


class HeldSink(EventSink):
    """An event sink whose writes of a point wait until the test lets them go (a slow
    disk or bucket); records what the training thread had done when each write ended."""

    def __init__(self, log_dir, fe, timeout: float = 20.0) -> None:
        super().__init__(log_dir)
        self.fe, self.timeout = fe, timeout
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.steps_at_write: list[int] = []  # the training's step when each point was written

    def write_steps(self, batches, wall_time=None) -> None:
        if any(v.tag == POINT_TAG for _, summaries in batches for s in summaries
               for v in s.value):
            self.started.release()
            self.release.wait(self.timeout)
            self.steps_at_write.append(self.fe.step_count)
        super().write_steps(batches, wall_time)


def held(tmp_path, **kw):
    fe, pipeline = make(tmp_path, **kw)
    sink = HeldSink(tmp_path / "held", fe)
    pipeline.set_sink(sink)
    return fe, pipeline, sink


def test_a_slow_write_does_not_hold_the_steps_and_close_writes_it(tmp_path):
    fe, pipeline, sink = held(tmp_path, every=4)
    train(fe, pipeline, 4)  # the point at step 4 goes to the worker, whose write waits
    assert sink.started.acquire(timeout=20)
    train(fe, pipeline, 3)  # these steps run while the point is not written yet
    assert sink.steps_at_write == []
    sink.release.set()
    pipeline.close()
    # written after the step loop ran on (a synchronous write would have waited for the
    # release, which only comes after the loop: the written step would be 4)
    assert sink.steps_at_write == [7]
    run = read(tmp_path / "held")
    assert tensor(run, "variable", "dense/kernel").steps.tolist() == [4]


def test_at_most_one_point_waits_and_nothing_is_lost(tmp_path):
    fe, pipeline, sink = held(tmp_path, every=2)
    trainer = threading.Thread(target=train, args=(fe, pipeline, 12))
    trainer.start()
    assert sink.started.acquire(timeout=20)  # the worker writes the point of step 2
    # Step 4's point waits; step 6's blocks the training thread until one is written.
    trainer.join(2.0)
    assert trainer.is_alive() and fe.step_count == 6 and fe.calls["point"] == 3
    sink.release.set()
    trainer.join(60)
    assert not trainer.is_alive()
    pipeline.close()
    run = read(tmp_path / "held")
    assert tensor(run, "variable", "dense/kernel").steps.tolist() == [2, 4, 6, 8, 10, 12]
    assert pipeline.failures.off == set()


def test_an_epoch_end_writes_beside_the_next_epoch_and_flush_waits(tmp_path):
    fe, pipeline, sink = held(tmp_path, every="epoch")
    train(fe, pipeline, 5)
    pipeline.end_epoch()
    pipeline.begin_epoch(1)
    assert sink.started.acquire(timeout=20)
    train(fe, pipeline, 2)
    sink.release.set()
    pipeline.flush()  # waits for the worker
    assert sink.steps_at_write == [7]
    run = read(tmp_path / "held")
    assert tensor(run, "variable", "dense/kernel").steps.tolist() == [5]
    pipeline.close()


def test_a_failing_job_is_reported_and_the_worker_goes_on():
    worker, ran = HostWorker(), []

    def fails():
        raise RuntimeError("a job's own error")

    worker.submit(fails)
    worker.submit(ran.append, 1, heavy=True)
    assert worker.wait(20) and ran == [1]
    worker.close()
    worker.submit(ran.append, 2)  # a closed worker starts again
    assert worker.wait(20) and ran == [1, 2]


def test_the_clock_flush_hands_its_work_over_and_never_waits_for_a_point(tmp_path):
    """flush_secs=0: every step's flush comes due. A point whose host work is held (a heavy
    point's numpy work, a slow disk) must not hold the steps after it: the clock's flush is
    a job behind the point's, and what it covers is on disk once the worker gets there."""
    fe, pipeline = make(tmp_path, every=2, flush_secs=0)
    release, started = threading.Event(), threading.Event()
    events: list[str] = []
    point = fe.point

    def held_point(step):
        done = point(step)

        def host():  # the point's host part, run by the worker
            events.append(f"host {step} started")
            started.set()
            release.wait(20)
            events.append(f"host {step} done")
            return done

        return host

    fe.point = held_point

    def steps(n):
        for _ in range(n):
            fe.step()
            pipeline.after_steps(1)
            events.append(f"step {fe.step_count} returned")

    steps(2)  # the point of step 2 goes to the worker, whose host part waits
    # Steps 3 to 5, each with a flush due; step 4's point waits behind step 2's. The join's
    # timeout only keeps a regression from hanging the suite: a flush that waited for the
    # worker would hold step 3 until the release below.
    trainer = threading.Thread(target=steps, args=(3,))
    trainer.start()
    trainer.join(20)
    assert not trainer.is_alive()
    assert [e for e in events if e.startswith("step")] == [f"step {s} returned"
                                                          for s in range(1, 6)]
    assert started.wait(20) and "host 2 done" not in events
    # What the clock flushed before the point is on disk; the steps after it wait their turn.
    assert written_steps(tmp_path) == [1]
    release.set()
    assert pipeline.worker.wait(20)  # no flush() from the user: the clock's flush ran
    assert events.index("host 2 done") > events.index("step 5 returned")
    assert written_steps(tmp_path) == [1, 2, 3, 4, 5]
    run = read(tmp_path)
    assert tensor(run, "variable", "dense/kernel").steps.tolist() == [2, 4]
    pipeline.close()


def written_steps(log_dir, tag="introspect/metric/loss"):
    return [e.step for e in events_of(log_dir) for v in e.summary.value if v.tag == tag]



def _ends(thread) -> bool:
    """Whether the ``WorkerThread`` ``thread`` ends within 20 s."""
    import time

    deadline = time.monotonic() + 20
    while thread.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return not thread.running


def test_each_background_thread_ends_when_idle_and_the_next_job_starts_another(monkeypatch):
    """The host worker and the findings' judge are a ``WorkerThread`` each: none is left
    behind once it has had nothing to do for ``IDLE_SECONDS``, and the next job starts
    another; a failed judgement ends the judge and turns ``on_finding`` off, warning once."""
    import warnings

    from tb_introspect.pipeline import findings, worker
    from tb_introspect.pipeline.failures import Failures

    monkeypatch.setattr(worker, "IDLE_SECONDS", 0.2)
    host, ran = HostWorker(), []
    for n in (1, 2):
        host.submit(ran.append, n)
        assert host.wait(20) and ran[-1] == n
        assert _ends(host._worker)

    monkeypatch.setattr(findings, "find_issues", lambda run: [])
    watch = findings.Watch(lambda f: None, "warning", Failures())
    for _ in range(2):
        watch.point()
        assert watch.judged(20) == [] and not watch.off
        assert _ends(watch._worker)

    def fails(run):
        raise RuntimeError("a rule's own error")

    monkeypatch.setattr(findings, "find_issues", fails)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        watch.point()
        assert watch.judged(20) == [] and watch.off
    assert ["a rule's own error" in str(w.message) for w in said] == [True]
    assert _ends(watch._worker)
    watch.point()  # off: nothing is judged, no thread starts
    assert not watch._worker.running
