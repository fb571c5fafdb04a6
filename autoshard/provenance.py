"""How a plan was found: which candidate won and what each search step added.

A sharder that weighs several candidates (``ppo``: its policy's decodes and rival sharders) or
improves a plan after finding it (the search stage, :mod:`autoshard.search.stage`) records this
on the plan, so that a reader sees which part chose it: the learned policy, a heuristic split
the policy placed, a rival sharder, the MILP, and what the search then took off its step cost.
Plan files keep it under ``provenance``; comparisons print :meth:`Provenance.summary`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError
from autoshard.limits import is_finite

#: Where a winning candidate came from.
SOURCES = ("policy", "policy over splits", "rival sharder", "milp", "plan in use")


@dataclass(frozen=True)
class Provenance:
    """How a plan was found.

    Args:
        candidate: The candidate that won, before any search step (e.g. ``ppo-split-greedy``:
            the policy's greedy decode over a split of the dominant tables; ``lookup_greedy``: a
            rival sharder's plan).
        source: Where it came from, one of :data:`SOURCES`.
        cost_ms: Its step cost.
        steps: Each search step that lowered the cost, as (step, step cost after it), in order.
        candidates: Every candidate's step cost, as (name, ms), the winner's included.
    """

    candidate: str
    source: str
    cost_ms: float
    steps: tuple[tuple[str, float], ...] = ()
    candidates: tuple[tuple[str, float], ...] = ()

    @property
    def final_ms(self) -> float:
        """The step cost after every step."""
        return self.steps[-1][1] if self.steps else self.cost_ms

    def summary(self) -> str:
        """One line: the source and candidate, then each step with the share of the cost it
        took off, e.g. ``policy over splits: ppo-split-greedy; polish -3.9%; resplit -0.2%``."""
        parts = [f"{self.source}: {self.candidate}"]
        before = self.cost_ms
        for step, cost in self.steps:
            parts.append(f"{step} {100 * (cost - before) / before:+.1f}%" if before > 0
                         else step)
            before = cost
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "source": self.source, "cost_ms": self.cost_ms,
                "steps": [{"step": s, "cost_ms": c} for s, c in self.steps],
                "candidates": dict(self.candidates)}

    @classmethod
    def from_dict(cls, doc: Any, source: str, where: str = "provenance") -> Provenance:
        """Reads what :meth:`to_dict` wrote.

        Raises:
            InputError: A field missing or of the wrong type, naming it.
        """
        def bad(name: str, value: object, what: str) -> InputError:
            return InputError(what, source=source, field=f"{where}.{name}", value=value)

        if not isinstance(doc, dict):
            raise InputError("expected a mapping", source=source, field=where, value=doc)
        for name in ("candidate", "source"):
            if not isinstance(doc.get(name), str):
                raise bad(name, doc.get(name), "expected a string")
        if doc["source"] not in SOURCES:
            raise bad("source", doc["source"], f"must be one of {', '.join(SOURCES)}")
        steps = doc.get("steps", [])
        candidates = doc.get("candidates", {})
        if not isinstance(steps, list) or not all(
                isinstance(s, dict) and isinstance(s.get("step"), str)
                and is_finite(s.get("cost_ms")) for s in steps):
            raise bad("steps", steps, "expected a list of {step, cost_ms}")
        if not isinstance(candidates, dict) or not all(
                isinstance(k, str) and is_finite(v) for k, v in candidates.items()):
            raise bad("candidates", candidates, "expected a mapping of name -> cost_ms")
        if not is_finite(doc.get("cost_ms")):
            raise bad("cost_ms", doc.get("cost_ms"), "expected a finite number")
        return cls(doc["candidate"], doc["source"], float(doc["cost_ms"]),
                   tuple((s["step"], float(s["cost_ms"])) for s in steps),
                   tuple((k, float(v)) for k, v in candidates.items()))
