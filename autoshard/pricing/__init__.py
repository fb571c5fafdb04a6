"""What a plan costs: the cost-model interface, the analytical model, per-shard terms, cost
curves, lower bounds and the evaluator."""
