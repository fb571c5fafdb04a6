"""Training the placement policy with MaskablePPO (sb3-contrib)."""
