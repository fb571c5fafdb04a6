"""The ``ppo`` sharder's tuning constants, in one place: task sizes, shares of the time limit,
and the search stage's budgets. Each says where its figure came from.
"""

from __future__ import annotations

#: Sampled rollouts by default: none. With the improvement stage polishing the cheapest
#: candidate, one rollout lowers the held-out families' mean cost by under 1% for about a third
#: more planning time (``benchmarks/bench_ppo.py --samples 1``, ``results/ppo/README.md``).
SAMPLES = 0
#: Tasks of up to this many (table, device) pairs get every split decode and candidate; larger
#: ones the main split choice only (the policy's own choice over it; ``ppo-split`` where that
#: fails), and ``lookup_greedy`` alone of the greedy family (its plan is the fallback, made
#: only where a decode might not end in time: :data:`FALLBACK_MARGIN`).
SMALL_TASK = 20_000
#: Over this many pairs (856 x 128 has 109,568) the search stage runs no re-split and no
#: kicks, only the polish and its settle: on the eight 856 x 128 tasks of
#: ``benchmarks/bench_large.py`` the re-split's quick mode took about 0.3 s of ppo's 2.0-2.5 s,
#: and without it the settle's plans were as cheap or cheaper on all eight at 60 s and on
#: seven at 10 s (the eighth 0.2% dearer); at 2,000 x 256 as cheap at 10 s, 0.05% dearer at
#: 60 s (a development comparison, one run each, 2-core Intel Xeon VM; not a committed
#: benchmark).
HUGE_TASK = 100_000
#: Shares of the time limit: a decode starts only if its estimate ends before the first, and
#: stops at the second (one begun in time may overrun it: at 2,000 x 256 and 10 s it ends near 6 s).
DECODE_SHARE, DECODE_STOP_SHARE = 0.6, 0.8
#: With the search stage (``polish``), the tuned policy's decodes start only if their estimate
#: ends before this share of the limit, so that they do not take the search's time where the
#: first policy's decodes already filled most of theirs.
TUNED_SHARE = 0.3
#: A decode is started only if this estimate of its seconds per (item, device) pair (the
#: pricing of its options and one network call per item; about 5e-6 to 8.5e-6 on this
#: project's 2-core machine in one run, more on a slower day) times its pairs fits before the
#: decodes' deadline. A running decode stops once its pace projects its end past the decodes'
#: stop, and its plan is dropped.
DECODE_SECONDS_PER_PAIR = 1e-5
#: On tasks over :data:`SMALL_TASK` pairs, where ``lookup_greedy`` is the only rival, its plan
#: is made before the decodes only when this many times the first decode's estimate does not fit
#: before the decodes' deadline; else only if no decode made a plan (at 856 x 128 it took
#: 0.11-0.17 s of ppo's 1.9-2.3 s and never won, in a development timing on a 2-core Intel
#: Xeon VM).
FALLBACK_MARGIN = 2.0
#: On tasks over :data:`SMALL_TASK` pairs, the winner is polished on while its moves help, for
#: at most this share of the time limit and this many rounds (moves) per device.
SETTLE_SHARE, SETTLE_ROUNDS_PER_DEVICE = 0.03, 1
#: Where tables dominate, the re-split and kicks start from this many candidates (time allowing).
REFINED = 2
#: The group re-solve (:func:`autoshard.sharders.ppo.portfolio.resolve`) starts only with at
#: least this many seconds left.
MIN_RESOLVE_S = 0.5
#: In a re-plan: the share of the time limit the candidates are made in without the budget
#: (the rest: bringing them within it and the search stage there), how many of the cheapest
#: distinct ones are brought within the budget, and the share of the time then left that the
#: re-split and kicks get (the group re-solve the rest).
REPLAN_EXPLORE_SHARE, REPLAN_CANDIDATES, REPLAN_REFINE_SHARE = 0.5, 8, 0.4


def decode_seconds(items: int, devices: int, samples: int) -> float:
    """A decode's estimated seconds: :data:`DECODE_SECONDS_PER_PAIR` per (item, device) pair,
    a quarter more per sampled rollout (they run in lockstep with the greedy one)."""
    return DECODE_SECONDS_PER_PAIR * items * devices * (1 + 0.25 * samples)
