"""Scale-out on lag: a consumer group grows from 1 to 3 agents and back to 1 under load.

What KEDA does to the Deployment (deploy/k8s-keda), done here by hand: real ``boxwatch
agent`` processes join one group on a real noida-db broker while a producer streams inputs
with unique ids into a 6-partition topic, then leave it again by SIGTERM (what a scale-down
sends). Nothing may be lost, duplicates are bounded by the batches in hand at the
rebalances (at-least-once), and the per-partition state moves cleanly: each partition has
one owner once the group settles, an agent reports lag only for the partitions it holds,
and the group's committed offsets reach the end of every partition.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
from kafka import TopicPartition
from kafka_helpers import AGENT_LIBRARIES, make_consumer
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

PARTITIONS = 6
BATCH = 64  # batch.max_records: what one agent can have in hand at a rebalance
RATE = 1500  # inputs per second, steady through every step
BAD_EVERY = 97  # every 97th input is malformed: its dead letter must be handed over too
GROUP = "grow"
SETTLE_S = 40.0  # the most one step may take to settle
_LAG = re.compile(r'boxwatch_agent_consumer_lag_records\{partition="(\d+)",topic="([^"]+)"\}')


def assigned(agent: AgentProcess) -> set[int]:
    """The input partitions ``agent`` reports lag for: those it holds (revoked ones are
    forgotten at once, new ones appear at the next lag update, 2 s apart)."""
    out = set()
    for series in agent.scrape():
        m = _LAG.fullmatch(series)
        if m and m.group(2) == TOPICS["inputs"]:
            out.add(int(m.group(1)))
    return out


def settle(members: list[AgentProcess], timeout: float = SETTLE_S) -> list[set[int]]:
    """Wait until ``members`` split every partition between them (each holds some, none
    shares one); return the split."""
    deadline = time.monotonic() + timeout
    split: list[set[int]] = []
    while time.monotonic() < deadline:
        for a in members:
            assert a.alive, f"an agent exited:\n{a.log_tail()}"
        split = [assigned(a) for a in members]
        union = set().union(*split)
        if all(split) and union == set(range(PARTITIONS)) and sum(map(len, split)) == PARTITIONS:
            return split
        time.sleep(0.25)
    raise AssertionError(f"{len(members)} agents did not split the partitions: {split}")


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_group_grows_to_three_agents_and_back_under_load(
    example, make_broker, agent_process_factory, record_property, library
):
    """1 -> 2 -> 3 -> 2 -> 1 agents while inputs stream: every input gets its verdict or
    dead letter, duplicates stay within the batches in hand at each rebalance."""
    broker = make_broker("noida").start()
    bootstrap = broker.bootstrap_servers
    create_model_topics(bootstrap, partitions=PARTITIONS)
    agents = [
        agent_process_factory(
            bootstrap,
            name=f"a{i}",
            topics=MODEL_TOPICS,
            group_id=GROUP,
            batch__max_records=BATCH,
            kafka__library=library,
        )
        for i in range(3)
    ]
    records = keyed_records(example, RATE * 90, "g", seed=4)
    bad = set(range(BAD_EVERY - 1, len(records), BAD_EVERY))
    for j in bad:  # a tensor of the wrong size: a dead letter keyed by the input's id
        key, value, headers = records[j]
        records[j] = (key, value[:12], headers)
    collector = OutputCollector(
        bootstrap, [TOPICS["verdicts"], TOPICS["dead_letter"]], json_topics=[TOPICS["verdicts"]]
    )
    producer = StreamProducer(bootstrap, TOPICS["inputs"], records, rate=RATE, chunk=50)
    steps: list[dict] = []
    t0 = time.monotonic()

    def step(members: list[AgentProcess], change: str) -> None:
        """Wait for ``members`` to settle; note the split and what the stream had reached."""
        split = settle(members)
        steps.append({"change": change, "split": split, "s": round(time.monotonic() - t0, 1)})
        print(f"{steps[-1]} sent {producer.sent}", flush=True)
        # Under load: the stream goes on through every step.
        before = collector.count
        assert collector.wait_for(lambda c: c.count > before + RATE // 2, timeout=20)

    first, second, third = agents
    try:
        collector.start()
        first.start().wait_ready()
        producer.start()
        step([first], "start 1")
        # Members that had a batch in hand at each rebalance: 1, 2, 3 and 2 of them.
        for members, change in (
            ([first, second], "join 2"),
            ([first, second, third], "join 3"),
        ):
            members[-1].start()
            step(members, change)
        for leaving, members, change in (
            (third, [first, second], "leave 3"),
            (second, [first], "leave 2"),
        ):
            assert leaving.stop() == 0, leaving.log_tail()
            step(members, change)
        # The group can settle in under 10 s: let the stream reach 10 s of records (bounded).
        deadline = time.monotonic() + 30
        while producer.sent < RATE * 10 and producer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        producer.stop_event.set()
        producer.join(timeout=30)
        assert producer.error is None, producer.error
        n = producer.sent
        assert n >= RATE * 10, f"only {n} inputs streamed"
        ids = [k.decode() for k, _, _ in records[:n]]
        bad_ids = {ids[j] for j in bad if j < n}
        good_ids = [i for i in ids if i not in bad_ids]

        def complete(c: OutputCollector) -> bool:
            verdicts, letters = c.ids[TOPICS["verdicts"]], c.keys[TOPICS["dead_letter"]]
            return all(verdicts[i] for i in good_ids) and all(letters[i] for i in bad_ids)

        done = collector.wait_for(complete, timeout=60)
        verdicts = Counter(collector.ids[TOPICS["verdicts"]])
        letters = Counter(collector.keys[TOPICS["dead_letter"]])
        sources = {}
        for body in collector.values[TOPICS["verdicts"]]:
            sources.setdefault(body["id"], set()).add(
                (body["source"]["partition"], body["source"]["offset"])
            )
        lost = [i for i in good_ids if not verdicts[i]] + [i for i in bad_ids if not letters[i]]
        assert done and not lost, f"{len(lost)} inputs lost, e.g. {lost[:5]}"
        assert first.scrape().get("boxwatch_agent_consumption_paused") == 0
        assert assigned(first) == set(range(PARTITIONS))
        assert first.stop() == 0, first.log_tail()
        # Commit before revoke: the group's offsets reach the end of every input partition,
        # so whoever takes a partition next starts after the last input handled.
        reader = make_consumer(bootstrap, group_id=GROUP)
        try:
            tps = [TopicPartition(TOPICS["inputs"], p) for p in range(PARTITIONS)]
            ends = reader.end_offsets(tps)
            committed = {tp.partition: reader.committed(tp) for tp in tps}
        finally:
            reader.close()
    finally:
        producer.stop_event.set()
        for a in agents:
            a.kill()
        collector.stop()
    assert committed == {tp.partition: ends[tp] for tp in tps}
    assert sum(ends.values()) == n
    assert set(verdicts) == set(good_ids) and set(letters) == bad_ids, "outputs for unsent ids"
    # A duplicate is the same input handled again, never another input under its id.
    assert all(len(s) == 1 for s in sources.values())
    duplicates = sum(verdicts.values()) - len(good_ids) + sum(letters.values()) - len(bad_ids)
    # Batches handled but not committed: commits a rebalance refused (noida-db starts the new
    # generation at once, so a member's commit then is refused). Only their inputs come
    # again, and at most the members of the group before each rebalance had one in hand:
    # 1, 2, 3 and 2. A refused commit is given up at once, never retried with backoff
    # (which held every member's rejoin up for 6 s and then gave up all the same).
    logs = [a.log_text() for a in agents]
    uncommitted = sum(text.count("commit refused") for text in logs)
    assert not any("may be redelivered" in text for text in logs)
    record_property("inputs", n)
    record_property("duplicates", duplicates)
    print(
        f"\nscale-out 1-2-3-2-1 ({library}): {n} inputs ({len(bad_ids)} malformed) in "
        f"{time.monotonic() - t0:.0f} s; steps {steps}; {duplicates} duplicates from "
        f"{uncommitted} uncommitted batches of at most {BATCH}"
    )
    assert uncommitted <= 1 + 2 + 3 + 2
    assert 0 <= duplicates <= BATCH * uncommitted
