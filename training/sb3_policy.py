"""The :class:`autoshard.policy.network.PlacementNet` as an sb3-contrib MaskablePPO policy.

The network is the features extractor; its output is [option logits | value latent]. The
"MLP extractor" only splits the two, the action head is the identity (the logits are final) and
the value head is SB3's usual linear layer.
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from autoshard.policy.buckets import N_BUCKETS
from autoshard.policy.network import PlacementNet


class PlacementExtractor(BaseFeaturesExtractor):
    """Runs :class:`PlacementNet`; features = [logits (actions), value latent (hidden)]."""

    def __init__(self, observation_space: spaces.Box, buckets: int = N_BUCKETS,
                 hidden: int = 64, grids: int = 1, refill: str = "none") -> None:
        net = PlacementNet(buckets, hidden, grids, refill)
        with torch.no_grad():
            logits, _ = net(torch.zeros(1, *observation_space.shape))
        super().__init__(observation_space, features_dim=logits.shape[1] + hidden)
        self.net = net
        self.actions = logits.shape[1]

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        logits, value = self.net(observations)
        return torch.cat([logits, value], dim=1)


class SplitHead(nn.Module):
    """Splits the extractor's output into (policy latent = logits, value latent)."""

    def __init__(self, actions: int, hidden: int) -> None:
        super().__init__()
        self.latent_dim_pi, self.latent_dim_vf = actions, hidden

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, :self.latent_dim_pi]

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, self.latent_dim_pi:]


class PlacementPolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy around :class:`PlacementNet`.

    Args:
        buckets: HBM-split buckets of the environment.
        hidden: Width of the network's hidden layers.
        grids: Option grids per device (2: the environment's split choice).
        refill: The environment's refill mode (:data:`autoshard.policy.refill.MODES`).
        *args, **kwargs: As for :class:`MaskableActorCriticPolicy`.
    """

    def __init__(self, *args: Any, buckets: int = N_BUCKETS, hidden: int = 64, grids: int = 1,
                 refill: str = "none", **kwargs: Any) -> None:
        kwargs.update(features_extractor_class=PlacementExtractor,
                      features_extractor_kwargs={"buckets": buckets, "hidden": hidden,
                                                 "grids": grids, "refill": refill},
                      ortho_init=False, share_features_extractor=True)
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        extractor = self.features_extractor
        assert isinstance(extractor, PlacementExtractor)
        self.mlp_extractor = SplitHead(extractor.actions, extractor.net.hidden)  # type: ignore[assignment]

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()
        self.optimizer = self.optimizer_class(  # type: ignore[call-arg]
            self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        kwargs = data["features_extractor_kwargs"]
        for key in ("features_extractor_class", "features_extractor_kwargs", "ortho_init",
                    "share_features_extractor"):
            data.pop(key, None)
        data.update(buckets=kwargs["buckets"], hidden=kwargs["hidden"],
                    grids=kwargs.get("grids", 1), refill=kwargs.get("refill", "none"))
        return data

    @property
    def net(self) -> PlacementNet:
        extractor = self.features_extractor
        assert isinstance(extractor, PlacementExtractor)
        return extractor.net
