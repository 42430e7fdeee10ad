"""`agent.network` in a config: the torso and backend every agent's `Config` holds
(`NetworkConfig`, which `rl.nn.networks.make_torso` reads) and the actor-critics' torsos
(`ActorCriticNetworkConfig`: SAC, TD3). Each `validate` names the config key whose value cannot
work.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rl.config.parsing import ConfigError, hp
from rl.nn.cnn import CNN_LAYERS, cnn_output_shape
from rl.nn.layers import ACTIVATIONS, BACKENDS, INITS

RECURRENT_TORSOS = ("gru", "lstm")
TORSOS = ("mlp", *CNN_LAYERS) + RECURRENT_TORSOS


@dataclass(frozen=True)
class NetworkConfig:
    """`agent.network` in a config: the torso that turns observations into features, and the
    backend. Each agent puts its own heads on the torso."""

    torso: str = hp("mlp", choices=TORSOS, doc="observation encoder")
    hidden: tuple[int, ...] = hp(
        (64, 64),
        doc="hidden widths of the torso (gru/lstm: of the layers before the cell; may be empty)",
    )
    activation: str = hp("relu", choices=tuple(ACTIVATIONS), doc="hidden activation")
    backend: str = hp("flax", choices=BACKENDS, doc="flax (linen) or haiku")
    init: str = hp(
        "orthogonal",
        choices=INITS,
        doc="dense/conv weight init: orthogonal with per-layer gains (sqrt 2 hidden, 0.01 "
        "policy, 1 value/Q), or lecun_uniform (U(+-sqrt(3/fan_in)), Brax's)",
    )
    layer_norm: bool = hp(
        False, doc="LayerNorm on each hidden layer's pre-activation (PQN's stabiliser)"
    )
    recurrent_hidden: int = hp(128, low=1, doc="hidden-state size of a gru or lstm torso")
    channels_first: bool = hp(
        False,
        doc="cnn torsos: images arrive [..., channels, height, width] (envpool's stacked Atari "
        "frames) and are moved to channels last on the device",
    )

    @property
    def recurrent(self) -> bool:
        """Whether the torso carries a hidden state (gru, lstm): only agents that declare
        `RECURRENT = True` take one (rl.config.check_recurrence)."""
        return self.torso in RECURRENT_TORSOS

    def validate(self):
        if (not self.hidden and not self.recurrent) or any(width < 1 for width in self.hidden):
            raise ConfigError(
                f"agent.network.hidden must list positive widths, got {list(self.hidden)}"
            )

    def check_obs_space(self, obs_space) -> None:
        """ConfigError (naming agent.network.torso) if the torso cannot read these observations."""
        if self.torso in CNN_LAYERS:
            try:
                cnn_output_shape(self.torso, obs_space, self.channels_first)
            except ValueError as err:
                raise ConfigError(f"agent.network.torso: {err}") from None


def network_config(**defaults) -> Any:
    """A dataclass field holding a `NetworkConfig` with an agent's own defaults."""
    return field(
        default_factory=lambda: NetworkConfig(**defaults),
        metadata=dict(doc="torso and backend (NetworkConfig)"),
    )


ACTOR_CRITIC_TORSOS = ("mlp", "simbav2")


@dataclass(frozen=True)
class ActorCriticNetworkConfig(NetworkConfig):
    """`agent.network` of the replay actor-critics (SAC, TD3): `NetworkConfig`'s keys, the
    critics' own widths, SimbaV2's torso (`rl.nn.simbav2`) and CrossQ's batch renormalisation
    (`rl.nn.batch_renorm`)."""

    torso: str = hp(
        "mlp",
        choices=ACTOR_CRITIC_TORSOS,
        doc="observation encoder: mlp, or simbav2 (hyperspherical residual blocks, rl.nn.simbav2: "
        "hidden lists one width per block, all equal)",
    )
    critic_hidden: tuple[int, ...] = hp(
        (), doc="hidden widths of the critics' torsos (empty: the same as hidden)"
    )
    batch_renorm: bool = hp(
        False,
        doc="batch renormalisation on the critics' input and after each hidden layer (CrossQ, "
        "rl.nn.batch_renorm; needs agent.target_networks: false)",
    )
    renorm_momentum: float = hp(
        0.99, low=0.0, high=1.0, high_open=True, doc="momentum of the running statistics"
    )
    renorm_warmup: int = hp(
        100_000, low=0, doc="training passes of plain batch normalisation before renormalising"
    )

    @property
    def actor(self) -> ActorCriticNetworkConfig:
        """The settings of the actor's torso: `hidden`, no batch renormalisation."""
        return replace(self, batch_renorm=False)

    @property
    def critic(self) -> ActorCriticNetworkConfig:
        """The settings of the critics' torsos: `critic_hidden` (if given) as the widths."""
        return replace(self, hidden=tuple(self.critic_hidden or self.hidden))

    def validate(self):
        super().validate()
        if any(width < 1 for width in self.critic_hidden):
            raise ConfigError(
                f"agent.network.critic_hidden must list positive widths, got "
                f"{list(self.critic_hidden)}"
            )
        if self.batch_renorm and self.torso != "mlp":
            raise ConfigError(
                f"agent.network.batch_renorm renormalises an mlp torso's layers, not "
                f"{self.torso!r}: set agent.network.torso: mlp or agent.network.batch_renorm: false"
            )
        if self.torso == "simbav2":
            for key in ("hidden", "critic_hidden"):
                widths = getattr(self, key)
                if len(set(widths)) > 1:
                    raise ConfigError(
                        f"agent.network.{key}: simbav2 stacks residual blocks of one width, one "
                        f"entry per block; got {list(widths)}"
                    )
            if self.layer_norm:
                raise ConfigError(
                    "agent.network.layer_norm: simbav2 normalises onto the hypersphere already; "
                    "set it to false"
                )


def actor_critic_network_config(**defaults) -> Any:
    """A dataclass field holding an `ActorCriticNetworkConfig` with an agent's own defaults."""
    return field(
        default_factory=lambda: ActorCriticNetworkConfig(**defaults),
        metadata=dict(doc="torsos and backend (ActorCriticNetworkConfig)"),
    )
