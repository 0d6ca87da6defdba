"""Crashes and scale-out: SIGKILLed agents lose nothing (at-least-once, bounded duplicates).

The agent runs as a real subprocess (``python -m boxwatch agent -c cfg.yaml``) against a
real noida-db broker; a producer thread streams binary inputs while the test kills and
restarts agents at seeded random moments.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
from reliability_helpers import (
    MODEL_TOPICS,
    TOPICS,
    AgentProcess,
    OutputCollector,
    StreamProducer,
    create_model_topics,
    keyed_records,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_CRASH = 20_000
KILLS = 5
BATCH = 256


@pytest.fixture
def noida(make_broker):
    return make_broker("noida").start()


@pytest.fixture
def tansu(make_broker):
    return make_broker("tansu").start()


def _missing(collector: OutputCollector, ids: list[str]) -> list[str]:
    got = collector.ids[TOPICS["verdicts"]]
    return [i for i in ids if got[i] == 0]


def test_sigkill_at_random_moments_loses_nothing(
    example, tansu, agent_process_factory, record_property
):
    """5 SIGKILLs while 20,000 binary inputs stream: every id gets >= 1 verdict.

    Runs on Tansu, like an Apache Kafka group: the killed member's session expires and the
    restarted agent takes its partitions. noida-db never expires a SIGKILLed member, and
    with static membership (group_instance_id) its rejoin sometimes stalls under load (seen
    twice on a loaded machine: the restarted member stayed assigned but was never served).
    """
    noida = tansu
    create_model_topics(noida.bootstrap_servers, partitions=4)
    agent = agent_process_factory(
        noida.bootstrap_servers, topics=MODEL_TOPICS, batch__max_records=BATCH
    )
    records = keyed_records(example, N_CRASH, "c", seed=1)
    ids = [k.decode() for k, _, _ in records]
    collector = OutputCollector.of_verdicts(noida.bootstrap_servers)
    # Slow enough that all kills (each followed by a ~10 s session expiry) fall in the stream.
    producer = StreamProducer(noida.bootstrap_servers, TOPICS["inputs"], records, rate=200)
    rng = random.Random(20261202)
    kills: list[dict] = []
    try:
        collector.start()
        agent.start().wait_ready()
        producer.start()
        for _ in range(KILLS):
            # Kill at a random moment while the agent is working through the stream.
            before = collector.count
            collector.wait_for(lambda c, b=before: c.count > b, timeout=60)
            time.sleep(rng.uniform(0.05, 0.8))
            kills.append({"at_verdicts": collector.count, "sent": producer.sent})
            agent.kill()
            assert agent.proc.returncode == -signal.SIGKILL
            ready_s = agent.start().wait_ready()
            print(
                f"{time.strftime('%X')} kill {kills[-1]} restart ready in {ready_s:.1f}s",
                flush=True,
            )
        producer.join(timeout=120)
        assert producer.error is None and producer.sent == N_CRASH, producer.error
        done = collector.wait_for(lambda c: not _missing(c, ids), timeout=150)
        missing = _missing(collector, ids)
        assert done and not missing, f"{len(missing)} inputs without a verdict, e.g. {missing[:5]}"
        assert agent.stop() == 0, agent.log_tail()
    finally:
        producer.stop_event.set()
        agent.kill()
        collector.stop()
    counts = collector.ids[TOPICS["verdicts"]]
    duplicates = sum(counts.values()) - len(ids)
    record_property("kills", len(kills))
    record_property("duplicates", duplicates)
    print(
        f"\ncrash test: {len(kills)} kills at {kills}; {N_CRASH} inputs; "
        f"{sum(counts.values())} verdicts; {duplicates} duplicates "
        f"(bound {BATCH} x {len(kills)} = {BATCH * len(kills)}); agent starts {agent.starts}"
    )
    assert len(kills) >= KILLS and agent.starts == KILLS + 1
    assert set(counts) == set(ids), "verdicts for ids that were never sent"
    assert 0 <= duplicates <= BATCH * len(kills)


def test_two_agents_split_partitions_and_the_survivor_takes_over(
    example, tansu, agent_process_factory
):
    """Two agents in one group share 4 partitions; SIGKILL one; nothing is lost.

    Runs on Tansu: noida-db never expires the session of a SIGKILLed member (measured: no
    reassignment within 60 s, with or without static membership), so its survivor would wait
    forever; Tansu reassigns after the 10 s session timeout like Apache Kafka.
    """
    noida = tansu
    create_model_topics(noida.bootstrap_servers, partitions=4)
    agents = [
        agent_process_factory(
            noida.bootstrap_servers,
            name=f"a{i}",
            topics=MODEL_TOPICS,
            group_id="scale",
            batch__max_records=64,
        )
        for i in range(2)
    ]
    n = 6_000
    records = keyed_records(example, n, "s", seed=1)
    ids = [k.decode() for k, _, _ in records]
    collector = OutputCollector.of_verdicts(noida.bootstrap_servers)
    producer = StreamProducer(noida.bootstrap_servers, TOPICS["inputs"], records, rate=300)

    def assigned(agent: AgentProcess) -> set[str]:
        return {k for k in agent.scrape() if k.startswith("boxwatch_agent_consumer_lag_records{")}

    try:
        collector.start()
        for a in agents:
            a.start()
        for a in agents:
            a.wait_ready()
        producer.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            split = [assigned(a) for a in agents]
            if all(split) and len(split[0] | split[1]) == 4 and not split[0] & split[1]:
                break
            time.sleep(0.5)
        assert all(split) and len(split[0] | split[1]) == 4, f"partitions not split: {split}"
        collector.wait_for(lambda c: c.count > 1000, timeout=60)
        inputs = [a.scrape().get('boxwatch_agent_inputs_total{kind="model"}', 0) for a in agents]
        assert all(v > 0 for v in inputs), f"one agent processed nothing: {inputs}"
        agents[0].kill()
        survivor = agents[1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(assigned(survivor)) < 4:
            time.sleep(0.5)
        assert len(assigned(survivor)) == 4, "the survivor did not take over all partitions"
        producer.join(timeout=90)
        assert producer.error is None and producer.sent == n, producer.error
        done = collector.wait_for(lambda c: not _missing(c, ids), timeout=90)
        missing = _missing(collector, ids)
        assert done and not missing, f"{len(missing)} inputs without a verdict, e.g. {missing[:5]}"
        assert survivor.alive and survivor.starts == 1
        assert survivor.stop() == 0, survivor.log_tail()
    finally:
        producer.stop_event.set()
        for a in agents:
            a.kill()
        collector.stop()
    counts = collector.ids[TOPICS["verdicts"]]
    print(
        f"\nscale-out: inputs per agent before the kill {inputs}; "
        f"{sum(counts.values()) - n} duplicates after the takeover"
    )
    assert sum(counts.values()) - n <= 64
