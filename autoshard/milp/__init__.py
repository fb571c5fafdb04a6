"""The MILP machinery RecShard's sharder is built on, shared with the search stage.

- :mod:`~autoshard.milp.curves`: each table's (or shard's) cost against its HBM bytes on each
  kind of device, as a convex hull of lines (the MILP's cost curves);
- :mod:`~autoshard.milp.model`: the MILP itself (HiGHS), whole or over a few devices at a time;
- :mod:`~autoshard.milp.plans`: plans from its solutions, warm starts and feasibility checks.
"""
