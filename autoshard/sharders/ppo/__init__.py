"""The learned sharder: a trained placement policy, decoded greedily and by sampling, with the
greedy sharders' plans as candidates; the plan with the lowest step cost wins.

Splits: the tables that dominate are split as ``split_lookup_greedy`` and ``recshard`` split them
(:func:`autoshard.layout.splitting.split_heavy_tables`), and the policy also places the
resulting shards as items (each shard priced like a table through the cost model); its split
decodes compete with
its whole-table ones. In one more decode the policy chooses the splits itself
(:mod:`autoshard.policy.choice`): at each dominant table it either places the table whole
or splits it as the heuristic would and places its shards (``ppo-choice-greedy``). On tasks
over :data:`SMALL_TASK` (table, device) pairs only the main split choice is offered (node-local
on hardware of several nodes, as ``recshard`` splits), through the policy's choice decode (its
plain decode only where that made no plan), with no whole-table decode where tables dominate
and :data:`FALLBACK` the only rival, where it is made (see the time limit below).

Time limit: ``time_limit`` seconds (the CLI's ``--time-limit``) for the whole run. The fallback
is made first (on tasks over :data:`SMALL_TASK` pairs only where the first decode might not end
in time: :data:`FALLBACK_MARGIN`; elsewhere only if no decode made a plan); a decode starts
only when its estimated time fits before :data:`DECODE_SHARE` of the limit, and stops at
:data:`DECODE_STOP_SHARE` (a first decode without a fallback, as in ``ppo-policy``, runs to
its end); the polish and the search stage's steps get time guards within what is left, and
the group re-solve that ends the stage on tasks of up to :data:`SMALL_TASK` pairs runs until
the limit at most.
The result's notes (:attr:`autoshard.sharders.base.Sharded.notes`) say what the limit cut.

The policy is read safely: a JSON config and a plain state dict of tensors
(``torch.load(weights_only=True)``), never a pickle. By default it is the policy committed
as package data under ``autoshard/data/ppo_policy``, with its fine-tuned second
(:data:`TUNED_POLICY`) decoded beside it on tasks of up to :data:`SMALL_TASK` pairs that keep
HBM room per table;
``policy=`` names another folder (e.g. the ``policy`` folder of an ``autoshard train`` run),
decoded alone.

The package reads top to bottom: :mod:`~autoshard.sharders.ppo.tuning` (the tuning constants),
:mod:`~autoshard.sharders.ppo.candidates` (what made each candidate plan, and the provenance
written for the winner), :mod:`~autoshard.sharders.ppo.portfolio` (the candidates' time
budget and improvement stage) and :mod:`~autoshard.sharders.ppo.sharder` (the sharders).
"""

from __future__ import annotations

from autoshard.sharders.ppo.sharder import (
    DEFAULT_POLICY,
    TUNED_POLICY,
    Choice,
    PPOPolicySharder,
    PPOSharder,
    policy_folders,
    policy_missing,
)

__all__ = ["DEFAULT_POLICY", "TUNED_POLICY", "Choice", "PPOPolicySharder", "PPOSharder",
           "policy_folders", "policy_missing"]
