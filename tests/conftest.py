"""Shared fixtures."""

from __future__ import annotations

import pytest
from handcase import hand_task_of

from autoshard.task import ShardingTask


@pytest.fixture
def hand_task() -> ShardingTask:
    """Tables A, B, C (36,000, 18,000, 18,000 B) on two devices of 36,000 B of HBM each."""
    return hand_task_of()
