"""The MILP machinery RecShard's sharder is built on, shared with the search stage.

- :mod:`~autoshard.milp.model`: the MILP itself (HiGHS), whole or over a few devices at a time,
  its cost constraints the lines under each table's cost curve
  (:class:`autoshard.pricing.curves.CostLines`);
- :mod:`~autoshard.milp.plans`: plans from its solutions, warm starts and bounds (whether a
  placement fits is :mod:`autoshard.layout.feasibility`).
"""
