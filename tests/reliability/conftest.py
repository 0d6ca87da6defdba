"""Fixtures of the reliability tests: the agent as a real subprocess, from a config file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from reliability_helpers import AgentProcess, agent_process

if TYPE_CHECKING:
    from example_build import ExampleArtifact


@pytest.fixture
def agent_process_factory(
    example: ExampleArtifact, tmp_path: Path
) -> Iterator[Callable[..., AgentProcess]]:
    """``agent_process_factory(bootstrap, source=example, *, name="agent", **settings)``: an
    unstarted ``python -m boxwatch agent -c NAME.yaml`` (its stderr goes to NAME.log).

    The config is ``write_agent_config``'s for ``source`` on ``bootstrap`` (``settings`` as
    there: ``group_id``, ``topics``, dotted keys with ``__``); every agent made is killed at
    teardown, whatever the test did.
    """
    made: list[AgentProcess] = []

    def factory(
        bootstrap: str,
        source: Any = example,
        *,
        name: str = "agent",
        **settings: Any,
    ) -> AgentProcess:
        made.append(agent_process(tmp_path, name, source, bootstrap, **settings))
        return made[-1]

    yield factory
    for agent in made:
        agent.kill()
