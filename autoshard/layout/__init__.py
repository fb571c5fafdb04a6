"""Where tables live: sharding kinds, shards and their layouts, plans, splitting, placement and
placement constraints."""
