"""A search stage that improves a finished plan, for any sharder to use.

- :mod:`~autoshard.search.polish`: HBM rows re-chosen per device (water-filling each device's
  items' cost curves), then tables and shards moved and swapped off the most loaded device;
- :mod:`~autoshard.search.resplit`: the heaviest tables' splits chosen again;
- :mod:`~autoshard.search.kick`: moves out of the polish's local optimum;
- :mod:`~autoshard.search.stage`: the three in turn, each kept only where it lowers the step
  cost, with a record of what each added.

``ppo`` runs it around its policy's decodes; ``recshard --opt polish=true`` after its MILP.
"""
