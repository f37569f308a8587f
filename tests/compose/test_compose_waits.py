"""Composition's background threads take any timeout they are given: one past what the thread primitives
wait (`threading.TIMEOUT_MAX`) neither kills a thread nor keeps a session's models from coming back."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("rapidfuzz")

from marginalia.compose import AugmentationCoordinator, MemoryItem, MemoryRequest  # noqa: E402


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What any thread died of, while the test runs."""
    died: list[BaseException] = []

    def hook(args: Any) -> None:
        died.append(args.exc_value)

    monkeypatch.setattr(threading, "excepthook", hook)
    return died


def test_a_wait_past_what_threads_take_is_cut_to_it():
    from marginalia.compose.threads import wait_limit

    assert wait_limit(1e308) == threading.TIMEOUT_MAX
    assert wait_limit(float("inf")) == threading.TIMEOUT_MAX
    assert wait_limit(2.5) == 2.5


def test_a_huge_memory_timeout_kills_no_thread(thread_errors):
    def fetch(request: MemoryRequest) -> list[MemoryItem]:
        return [MemoryItem("kept", "a.md", "a", (), 0, 4, "takeaway")]

    coordinator = AugmentationCoordinator(fetch, threshold=2, memory_size=3, timeout=1e308)
    try:
        assert coordinator.observe("one two", [1, 2]) is not None
        assert coordinator.wait_idle(10)
        assert [m.text for m in coordinator.memory] == ["kept"]
    finally:
        coordinator.close()
        assert coordinator.join(10)
    assert thread_errors == []


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan")])
def test_a_timeout_that_is_not_positive_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be positive"):
        AugmentationCoordinator(lambda r: [], threshold=2, memory_size=3, timeout=timeout)
