"""The seeded chat workload."""

from __future__ import annotations

import pytest

from llmmesh.bench.workload import ChatWorkload


def test_the_workload_is_deterministic() -> None:
    first = ChatWorkload().requests("c8", 32, 128)
    again = ChatWorkload().requests("c8", 32, 128)
    assert first == again
    assert ChatWorkload(seed=7).requests("c8", 4, 128) != ChatWorkload(seed=8).requests("c8", 4, 128)


def test_the_system_prompt_is_shared_and_long() -> None:
    workload = ChatWorkload()
    requests = workload.requests("c32", 128, 128)
    assert {request.system for request in requests} == {workload.system_prompt}
    # About one token per word with the tiny model: past two 128-token blocks.
    assert len(workload.system_prompt.split()) >= 2 * 128 - 20


def test_user_messages_differ_within_and_across_phases() -> None:
    workload = ChatWorkload()
    c8 = workload.requests("c8", 32, 128)
    c32 = workload.requests("c32", 128, 128)
    users = [request.user for request in c8 + c32]
    assert len(set(users)) == len(users)
    assert len({request.request_id for request in c8 + c32}) == len(users)


def test_user_messages_have_the_configured_length() -> None:
    for request in ChatWorkload(user_words=(30, 60)).requests("c8", 64, 16):
        assert 30 <= len(request.user.split()) <= 60
        assert request.max_tokens == 16


def test_a_prefix_of_a_phase_is_the_smaller_phase() -> None:
    # Request i of a phase does not depend on how many requests were asked for.
    workload = ChatWorkload()
    assert workload.requests("c2", 4, 16) == workload.requests("c2", 10, 16)[:4]


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="user_words"):
        ChatWorkload(user_words=(10, 5))
    with pytest.raises(ValueError, match="max_tokens"):
        ChatWorkload().requests("c1", 1, 0)
