"""Re-planning: what moves between two plans, what the move costs, and planning again within a
move budget.

- :mod:`~autoshard.replan.moves`: the move arithmetic, its one owner: which bytes of each item
  (table or shard) of a new plan are already where it goes, which are sent from other devices or
  copied between a device's host memory and its HBM, over which link, and in how many seconds;
- :mod:`~autoshard.replan.budget`: how much a re-plan may move (bytes, a share of the tables'
  bytes, seconds) or what a moved byte costs (its transfer time spread over the steps until the
  next re-plan), and which moves the runtime can make;
- :mod:`~autoshard.replan.carry`: the plan in use carried onto new tables or hardware (the
  re-plan that moves nothing it need not);
- :mod:`~autoshard.replan.repair`: any plan brought within a budget, table by table;
- :mod:`~autoshard.replan.diff`: the report of two plans' difference and its price;
- :mod:`~autoshard.replan.drift`: a plan made on one day's statistics priced on the next's, and
  what re-planning with and without a budget buys.

:func:`autoshard.planning.plan` with ``previous=`` and ``move_budget=`` is the re-plan's one
sequence.
"""
