"""A worker killed with its prefetch costs one lease, not the broker's visibility timeout.

Issue 18. A prefork worker's whole process tree is SIGKILLed again and again
(an OOM kill, a lost node, a pod killed after its grace period) while jobs
fall due, once on the Redis broker and once on RabbitMQ. Every timeout is its
default: the lease (30 s), the delivery deadline (2 h), kombu's visibility
timeout (1 h). On Redis, kombu keeps what a dead worker had prefetched in its
``unacked`` hash until that visibility timeout. The worker's main process held
each message it received (``task_received``) under its lease, from its next
heartbeat on, so the reaper republishes those one lease after the death; what
it took less than a beat before it died beat finds in kombu's unacked index a
lease after it was taken. RabbitMQ requeues them itself the moment the
connection dies. Either way:

* every occurrence a dead worker held (started or only received) starts again
  within two leases of the kill (the restart's arrival at the target, against
  the kill, both on this machine's clock, which is the one Redis' ``TIME``
  reads); so does every other occurrence in flight then, which only waited in
  the broker. One that a later kill found held again (recovered, and taken by
  the next worker to die) is measured from that kill. A republished occurrence
  goes to the front of its list, so its restart does not wait for the backlog;
* every re-execution is explained by a kill of the worker that ran the first;
* no job is parked at the end: each one settles a run after the loop;
* dead letters only for jobs whose executions were really killed
  ``max_deliveries`` times.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from kombu.transport.redis import Channel

from celery_zsched.beat.unacked import occurrence_in
from celery_zsched.store import task_id_for
from e2e.conftest import Deployment
from e2e.names import ENV_START_DELAY_S, START_DELAYED
from e2e.observe import SOAK, counters, report, states, stuck_report, wait_all, wait_ready
from e2e.targets import Arrival, PacedTarget

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600 if SOAK else 600)]

JOBS = 500 if SOAK else 120
KILLS = 50 if SOAK else 4
INTERVAL_S = 90.0 if SOAK else 20.0
CONCURRENCY = 8 if SOAK else 4
#: Each request is held this long at the target, so kills land on running tasks.
TASK_S = 0.3
#: Between a worker being ready and its kill.
ALIVE_S = (2.0, 4.0)

#: (job id, occurrence, attempt)
Occ = tuple[str, int, int]
#: The hash in which kombu's Redis transport keeps delivered, unacked messages.
UNACKED = Channel.unacked_key


@dataclass(frozen=True)
class Kill:
    """One SIGKILL of a worker's whole tree, and what it held then."""

    worker: str
    at_ms: int  # Redis' clock, right after the kill
    #: Started by it and not settled: these executions were killed.
    running: frozenset[Occ]
    #: Received by it and not started: what it left in kombu's unacked hash (early
    #: ack: a started message is acknowledged). On RabbitMQ the broker requeues these
    #: itself and the test cannot list them.
    held: frozenset[Occ]
    #: Every occurrence in flight at the kill (queued or running), held or not.
    in_flight: frozenset[Occ]


def _unacked(d: Deployment) -> dict[bytes, Occ]:
    """The zsched messages in kombu's unacked hash (Redis broker), by delivery tag."""
    if d.broker is None:
        return {}
    out = {}
    for tag, raw in d.broker.hgetall(UNACKED).items():
        found = occurrence_in(raw)
        if found is not None:
            out[tag] = found[:3]
    return out


def _snapshot(d: Deployment, worker: str, at_ms: int,
              seen: set[tuple[str, int, int, int]], unacked_before: set[bytes]) -> Kill:
    """What the kill of ``worker`` hit. An execution still running from an earlier kill
    (its lease has not run out yet) is in ``seen``: it was that kill's; so is an unacked
    message that was there before this worker's death."""
    running: set[Occ] = set()
    in_flight: set[Occ] = set()
    for job_id, st in states(d).items():
        occ = (job_id, st.occurrence, st.attempt)
        if st.status in ("queued", "running"):
            in_flight.add(occ)
        execution = (*occ, st.started_ms or 0)
        if st.status == "running" and execution not in seen:
            seen.add(execution)
            running.add(occ)
    unacked = _unacked(d)
    held = {occ for tag, occ in unacked.items() if tag not in unacked_before}
    unacked_before |= set(unacked)
    return Kill(worker, at_ms, frozenset(running), frozenset(held), frozenset(in_flight))


def _restarts(kills: list[Kill], k: int, arrivals: list[Arrival],
              dead: set[str]) -> dict[Occ, int | None]:
    """Ms from kill ``k`` to the first arrival of each occurrence in flight then (its
    restart; ``None``: it never ran again). Dead-lettered jobs are left out, and so is
    one that a later kill found held again before it ran: it was recovered and
    delivered once more, and its restart is that kill's to measure."""
    kill = kills[k]
    first: dict[str, int] = {}
    for arrival in arrivals:
        at_ms = int(arrival.at * 1000)
        if at_ms > kill.at_ms:
            first.setdefault(arrival.task_id, at_ms)
    out: dict[Occ, int | None] = {}
    for occ in kill.in_flight:
        if occ[0] in dead:
            continue
        ran = first.get(task_id_for(*occ))
        if any(occ in later.held and (ran is None or later.at_ms < ran)
               for later in kills[k + 1:]):
            continue
        out[occ] = None if ran is None else ran - kill.at_ms
    return out


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_worker_killed_with_its_prefetch_costs_one_lease_not_the_visibility_timeout(
        broker: str, deploy: Callable[..., Deployment], targets: Callable[..., PacedTarget],
        request: pytest.FixtureRequest) -> None:
    d = deploy(broker=broker)  # every timeout at its default
    lease_ms = int(d.settings.lease_s * 1000)
    target = targets(TASK_S)
    jobs = [d.job(url=target.url(f"/crash/{i}"), interval_s=INTERVAL_S) for i in range(JOBS)]
    # All due at once, and again an interval after each run: waves, so that kills find
    # workers with a full prefetch (received, not started), not only running tasks.
    assert d.store.upsert_many(jobs, stagger=False).created == JOBS
    ids = [job.id for job in jobs]
    d.start_beat()

    rng = random.Random(18)
    kills: list[Kill] = []
    seen: set[tuple[str, int, int, int]] = set()
    unacked_before: set[bytes] = set()
    for k in range(KILLS):
        worker = d.start_worker(f"w{k}", pool="prefork", concurrency=CONCURRENCY)
        wait_ready(d, worker)
        time.sleep(rng.uniform(*ALIVE_S))
        tree = worker.kill_tree()
        # Redis may still be applying a command the worker sent before it died.
        time.sleep(0.1)
        kills.append(_snapshot(d, worker.name, d.store.now_ms(), seen, unacked_before))
        worker.wait_dead(tree)

    end_ms = d.store.now_ms()
    wait_ready(d, d.start_worker("last", pool="prefork", concurrency=CONCURRENCY))
    try:
        final = wait_all(d, ids,
                         lambda st: st.status == "dead" or (st.last_settled_ms or 0) > end_ms,
                         INTERVAL_S + 2 * lease_ms / 1000 + 90,
                         "every live job to settle a run after the crash loop")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {stuck_report(d, ids, end_ms)}") from None

    arrivals = target.arrivals()
    dead = {job_id for job_id, st in final.items() if st.status == "dead"}
    after = [_restarts(kills, k, arrivals, dead) for k in range(len(kills))]
    restarts = sorted(ms for one in after for ms in one.values() if ms is not None)
    held_restarts = sorted(ms for kill, one in zip(kills, after, strict=True)
                           for occ, ms in one.items() if occ in kill.held and ms is not None)
    held = [occ for kill in kills for occ in kill.held]
    parked = [occ for one in after for occ, ms in one.items() if ms is None]
    # Re-executions: consecutive arrivals of one task id must be explained by a kill
    # of the worker that ran the earlier one, while it ran it.
    by_task: dict[str, list[Arrival]] = {}
    for arrival in arrivals:
        by_task.setdefault(arrival.task_id, []).append(arrival)
    killed = {(kill.worker, task_id_for(*occ)): kill for kill in kills for occ in kill.running}
    unexplained = [(task_id, a.worker, b.worker)
                   for task_id, hits in by_task.items()
                   for a, b in itertools.pairwise(hits)
                   if (a.worker, task_id) not in killed
                   or b.at * 1000 <= killed[(a.worker, task_id)].at_ms]
    crashes = Counter(occ for kill in kills for occ in kill.running)
    expected_dead = {occ[0] for occ, n in crashes.items() if n >= d.settings.max_deliveries}
    tally = counters(d)
    report(request, f"worker_crash_loop_{broker}", jobs=JOBS, kills=KILLS,
           killed_executions=sum(crashes.values()), held_unstarted=len(held),
           restarts=len(restarts),
           restart_ms_p50=restarts[len(restarts) // 2] if restarts else None,
           restart_ms_max=restarts[-1] if restarts else None,
           held_restart_ms_p50=held_restarts[len(held_restarts) // 2] if held_restarts else None,
           held_restart_ms_max=held_restarts[-1] if held_restarts else None, lease_ms=lease_ms,
           unexplained_reexecutions=len(unexplained), parked=len(parked),
           dead=len(dead), dead_expected=len(expected_dead), orphaned=tally["orphaned"],
           redelivered=tally["redelivered"], duplicates_dropped=tally["duplicates"],
           executions=len(arrivals), occurrences=len(by_task))

    assert sum(crashes.values()) >= 1, "the kills must land on running tasks"
    if broker == "redis":
        assert held, "the kills must land on prefetched, unstarted messages"
        assert held_restarts and held_restarts[-1] <= 2 * lease_ms, \
            _slowest(kills, after, arrivals)
        assert tally["orphaned"] >= 1
    assert restarts and restarts[-1] <= 2 * lease_ms, _slowest(kills, after, arrivals)
    assert not parked, parked[:5]
    assert not unexplained, unexplained[:5]
    assert dead == expected_dead, (dead, expected_dead)


def _slowest(kills: list[Kill], after: list[dict[Occ, int | None]],
             arrivals: list[Arrival]) -> list[str]:
    """The five slowest restarts, each with every kill that found it in flight, for a
    failure's message: which worker held it, and when it ran again."""
    ranked = sorted(((ms, k, occ) for k, one in enumerate(after)
                     for occ, ms in one.items() if ms is not None), reverse=True)[:5]
    runs: dict[str, list[str]] = {}
    for arrival in arrivals:
        runs.setdefault(arrival.task_id, []).append(
            f"{arrival.worker}@{int(arrival.at * 1000) - kills[0].at_ms}")
    out = []
    for ms, k, occ in ranked:
        seen_at = [f"kill {i} ({kill.worker}@{kill.at_ms - kills[0].at_ms}"
                   f"{' running' if occ in kill.running else ''}"
                   f"{' held' if occ in kill.held else ''})"
                   for i, kill in enumerate(kills) if occ in kill.in_flight]
        out.append(f"{occ} {ms} ms after kill {k} (at {kills[k].at_ms}, first kill at "
                   f"{kills[0].at_ms}); in flight at {', '.join(seen_at)}; "
                   f"ran {runs.get(task_id_for(*occ), [])}")
    print("\nslowest restarts:\n" + "\n".join(out))
    return out[:1]



#: Pool processes of the worker killed between acknowledging and starting.
ACCEPTED = 4


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_worker_killed_between_acknowledging_and_starting_costs_one_lease(
        broker: str, deploy: Callable[..., Deployment], targets: Callable[..., PacedTarget],
        request: pytest.FixtureRequest) -> None:
    """Acknowledged early and not started: no broker gives these messages back.

    Every pool process of a prefork worker accepts a task, so the main process
    acknowledges its message (Celery's default early ack), and waits before its
    start; the whole tree is SIGKILLed then. That window is a millisecond in
    production (the crash loop above hit it twice in 50 kills); here it is held
    open. The main process held each message in Redis before acknowledging it,
    so the reaper republishes them one lease after the kill: each runs within
    two leases (every timeout at its default), not at the 2 h delivery deadline.
    """
    d = deploy(broker=broker)
    lease_ms = int(d.settings.lease_s * 1000)
    target = targets(0.0)
    jobs = [d.job(url=target.url(f"/acked/{i}"), interval_s=3600) for i in range(ACCEPTED)]
    assert d.store.upsert_many(jobs, stagger=False).created == ACCEPTED
    ids = [job.id for job in jobs]
    d.start_beat()
    worker = d.start_worker("stalled", pool="prefork", concurrency=ACCEPTED,
                            env={ENV_START_DELAY_S: "3600"})
    d.wait_for(lambda: worker.text().count(START_DELAYED) == ACCEPTED, 120,
               "every pool process to accept a task")
    if broker == "redis":  # kombu forgot them: not even beat's unacked sweep sees them
        d.wait_for(lambda: not _unacked(d), 30, "the early acknowledgements")
    else:  # RabbitMQ shows no acknowledgement: give the main process a moment
        time.sleep(1.0)
    tree = worker.kill_tree()
    killed_ms = d.store.now_ms()
    worker.wait_dead(tree)
    assert not target.arrivals(), "no occurrence may have started before the kill"
    assert {st.status for st in states(d).values()} == {"queued"}

    wait_ready(d, d.start_worker("after", pool="prefork", concurrency=ACCEPTED))
    wait_all(d, ids, lambda st: (st.last_settled_ms or 0) > killed_ms,
             2 * lease_ms / 1000 + 60, "every acknowledged, unstarted occurrence to run")
    arrivals = target.arrivals()
    restart_ms = sorted(int(a.at * 1000) - killed_ms for a in arrivals)
    tally = counters(d)
    report(request, f"worker_killed_after_ack_{broker}", occurrences=ACCEPTED,
           runs=len(arrivals), restart_ms_min=restart_ms[0], restart_ms_max=restart_ms[-1],
           lease_ms=lease_ms, orphaned=tally["orphaned"])
    assert len({a.task_id for a in arrivals}) == len(arrivals) == ACCEPTED  # each once
    assert restart_ms[-1] <= 2 * lease_ms, restart_ms
    assert tally["orphaned"] >= ACCEPTED


#: Jobs of the BRPOP-window test: a steady flow, so later messages follow the lost one.
FLOW_JOBS = 40
FLOW_INTERVAL_S = 10.0


def test_a_worker_killed_between_brpop_and_recording_the_message_costs_about_a_lease(
        deploy: Callable[..., Deployment], targets: Callable[..., PacedTarget],
        request: pytest.FixtureRequest) -> None:
    """Taken from the list, and recorded nowhere: no broker gives this message back.

    kombu's Redis transport takes a message with BRPOP and records it in its
    unacked hash only once it has read the reply; a worker killed in between (in
    production: its loop busy with another message while the reply waits in the
    socket) takes it along. Here a consumer makes that BRPOP and is SIGKILLed
    before it records anything. Every timeout is at its default. The message is
    in no list, no unacked hash, no hold: beat infers it from the list's order
    once later messages started, or the list emptied (``lost.lua``), so it runs
    within two leases of the kill, once, and not at the 2 h delivery deadline.
    """
    d = deploy()  # every timeout at its default
    assert d.broker is not None
    lease_ms = int(d.settings.lease_s * 1000)
    target = targets(0.0)
    jobs = [d.job(url=target.url(f"/brpop/{i}"), interval_s=FLOW_INTERVAL_S)
            for i in range(FLOW_JOBS)]
    assert d.store.upsert_many(jobs).created == FLOW_JOBS  # first runs staggered
    ids = [job.id for job in jobs]
    d.start_beat()
    d.wait_for(lambda: d.broker.llen(d.queue) > 0, 60, "a message in the broker's list")
    _, raw = d.broker.brpop([d.queue], timeout=5) or (None, b"")
    lost = occurrence_in(b"[" + raw + b"]")
    assert lost is not None, raw
    killed_ms = d.store.now_ms()  # the consumer died with it: nothing recorded it
    assert d.store.get(lost[0]).status == "queued"
    assert not _unacked(d)

    wait_ready(d, d.start_worker("after", pool="prefork", concurrency=4))
    task_id = task_id_for(*lost[:3])
    d.wait_for(lambda: any(a.task_id == task_id for a in target.arrivals()),
               2 * lease_ms / 1000 + 60, "the lost message's occurrence to run")
    end_ms = d.store.now_ms()
    wait_all(d, ids, lambda st: (st.last_settled_ms or 0) > end_ms, FLOW_INTERVAL_S + 60,
             "every job to settle a run after it")
    runs = [a for a in target.arrivals() if a.task_id == task_id]
    restart_ms = int(runs[0].at * 1000) - killed_ms
    tally = counters(d)
    report(request, "worker_killed_in_the_brpop_window", restart_ms=restart_ms,
           lease_ms=lease_ms, orphaned=tally["orphaned"], lost=tally["lost"],
           duplicates_dropped=tally["duplicates"])
    assert len(runs) == 1
    assert restart_ms <= 2 * lease_ms, restart_ms
    assert tally["orphaned"] >= 1
    assert tally["lost"] == 0  # not the delivery deadline's doing
