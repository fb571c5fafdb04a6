"""The learned placement policy at inference time: episodes, observations, the network.

- :mod:`~autoshard.policy.episode`: a placement episode (tables costliest first, each placed on
  a device and an HBM-split bucket), its observations and action masks;
- :mod:`~autoshard.policy.choice`: episodes in which the policy also chooses which dominant
  tables to split;
- :mod:`~autoshard.policy.features`, :mod:`~autoshard.policy.buckets`: the observation layout
  and the HBM-split buckets;
- :mod:`~autoshard.policy.network`: the network, read safely (JSON config and a tensor state
  dict), and its decodes.

The sharders ``ppo-policy`` (the decodes alone) and ``ppo`` (decodes, rival sharders and the
search stage, :mod:`autoshard.search`) use it; training (:mod:`autoshard.training`) and the
Gymnasium environment (:mod:`autoshard.envs`) play the same episodes.
"""
