"""Microbenchmarks of embedding operators and the learned cost model trained on them."""
