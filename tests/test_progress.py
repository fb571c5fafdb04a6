"""Progress of long commands (autoshard.cli.progress): what is done, the rate and the time
left, as lines where there is no terminal; ranks' steps counted from their stages."""

from __future__ import annotations

import pytest

from autoshard.cli import progress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_say_done_rate_and_time_left_every_period() -> None:
    clock, said = _Clock(), []
    lines = progress.Lines("training", 300, "steps", said.append, every=10.0, clock=clock)
    clock.now += 5.0
    lines.advance(50)
    assert said == []  # not yet due
    clock.now += 5.0
    lines.advance(50)
    assert said == ["training: 100 of 300 steps (33%), 10 steps/s, 20 s left (10 s)"]
    clock.now += 1.0
    lines.advance(10)
    assert len(said) == 1
    lines.say()
    assert said[-1].startswith("training: 110 of 300 steps (37%)")


def test_lines_without_a_total_say_the_count_and_rate() -> None:
    clock, said = _Clock(), []
    lines = progress.Lines("measuring", None, "configurations", said.append, clock=clock)
    clock.now += 20.0
    lines.advance(40)
    assert said == ["measuring: 40 configurations, 2 configurations/s (20 s)"]


def test_ranks_steps_count_what_every_rank_has_done(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    monkeypatch.setattr(progress, "progress_bar",
                        lambda label, total, unit: _Advance(seen))
    with progress.rank_steps("run", 5) as stages:
        stages(["connected", "starting"])
        stages(["step 0 done", "step 1 done"])
        stages(["step 2 (in a collective)", "step 3 done"])
        stages(["step 4 done", "step 4 done"])
    assert seen == [1, 1, 3]  # the slowest rank: 1, then 2 (in step 2), then 5 steps


class _Advance:
    """A stand-in bar recording each advance."""

    def __init__(self, seen: list[float]) -> None:
        self.seen = seen

    def __enter__(self) -> object:
        return self.seen.append

    def __exit__(self, *args: object) -> None:
        return None


def test_progress_without_a_terminal_is_lines_on_stderr(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(progress, "err_console", Console(stderr=True, force_terminal=False))
    with progress.progress_bar("measuring", 3, "configurations") as advance:
        advance(3)
    out, err = capsys.readouterr()
    assert out == "" and "measuring: 3 of 3 configurations (100%)" in err


def test_a_timed_job_says_when_it_is_done(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rich.console import Console

    monkeypatch.setattr(progress, "err_console", Console(stderr=True, force_terminal=False))
    clock = iter([0.0, 3.5])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock, 3.5))
    with progress.timed("planning with recshard (limit 60 s)", 60.0, every=3600.0):
        time.sleep(0)
    _, err = capsys.readouterr()
    assert err.strip() == "planning with recshard (limit 60 s): done in 3.5 s"
