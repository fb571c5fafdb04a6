"""Candidates are values, not names: no sharder compares, prefixes or splits a candidate's
name, and a candidate's name (written into plan files) is derived from its fields."""

from __future__ import annotations

import ast
from pathlib import Path

import autoshard.sharders
from autoshard.layout.plan import Plan
from autoshard.sharders.ppo.candidates import Candidate, provenance

SHARDERS = Path(autoshard.sharders.__file__).resolve().parent
#: String methods that read a name by its text.
NAME_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "split", "partition"}


def _looks_like_candidate(value: object) -> bool:
    """Whether a string constant reads like (part of) a candidate's name."""
    return isinstance(value, str) and (value.startswith(("ppo", "+", "-greedy", "-sample"))
                                       or value in {"+", "-tuned"})


def _offences(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            args += [e.value for a in node.args if isinstance(a, ast.Tuple) for e in a.elts
                     if isinstance(e, ast.Constant)]
            if method in NAME_METHODS and any(_looks_like_candidate(a) for a in args):
                found.append(f"line {node.lineno}: .{method}({args})")
            if method in NAME_METHODS - {"split", "partition"} and any(
                    isinstance(a, ast.Name) and a.id.isupper() for a in node.args):
                found.append(f"line {node.lineno}: .{method}(<a constant of names>)")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and _looks_like_candidate(s.value)
                   and "-" in str(s.value)[3:] and str(s.value).count("-") > 1
                   for s in sides):
                found.append(f"line {node.lineno}: comparison with a candidate name")
    return found


def test_no_sharder_reads_a_candidate_name_as_text() -> None:
    offences = {str(p.relative_to(SHARDERS)): _offences(ast.parse(p.read_text()))
                for p in SHARDERS.rglob("*.py")}
    assert {p: o for p, o in offences.items() if o} == {}


def test_the_checker_catches_the_old_patterns() -> None:
    old = ('any(n.startswith("ppo-choice") for n in plans)\n'
           'base, *stages = winner.split("+")\n'
           'x = name.startswith(POLISHED)\n'
           'y = name == "ppo-split-greedy"\n')
    assert len(_offences(ast.parse(old))) == 4


def test_a_candidates_name_and_provenance_come_from_its_fields() -> None:
    plan = Plan((), "ppo")
    decode = Candidate.decoded("ppo-split", "-refill", True, 2, plan, 4.0)
    polished = decode.then("polish", plan, 3.0).then("lns", plan, 2.5)
    rival = Candidate.of_rival("lookup_greedy", plan, 5.0)
    assert polished.name == "ppo-split-refill-sample-2-tuned+polish+lns"
    assert rival.name == "lookup_greedy" and rival.layout == "ppo"
    assert polished.origin == decode.origin != rival.origin
    record = provenance(polished, [decode, rival, polished])
    assert (record.candidate, record.source, record.cost_ms) == (
        "ppo-split-refill-sample-2-tuned", "policy over splits", 4.0)
    assert record.steps == (("polish", 3.0), ("lns", 2.5))
    assert record.candidates == (("ppo-split-refill-sample-2-tuned", 4.0),
                                 ("lookup_greedy", 5.0),
                                 ("ppo-split-refill-sample-2-tuned+polish+lns", 2.5))
    assert Candidate.decoded("ppo", "", False, None, plan, 1.0).source == "policy"
    assert rival.source == "rival sharder"
