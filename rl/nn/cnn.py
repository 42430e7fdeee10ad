"""Conv torsos for image observations: a conv stack (`CNN_LAYERS`: MinAtar's net, Nature DQN's)
on float32 images [..., H, W, C], flattened, then the dense `hidden` layers
(`rl.nn.networks.make_torso` builds one for `agent.network.torso: cnn_minatar | nature_cnn`).
`image_input` makes those images of what an env gives: uint8 frames scaled to [0, 1], frames stacked
channels first (envpool's Atari, [..., C, H, W]) moved to channels last on the device.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from rl.nn.layers import activation, mlp

# Conv stacks of the cnn torsos, (features, kernel, stride) per layer, VALID padding; the dense
# layers after them are `agent.network.hidden`: MinAtar's net (Young & Tian 2019), then hidden
# [128]; Nature DQN's (Mnih et al. 2015), then hidden [512].
CNN_LAYERS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "cnn_minatar": ((16, 3, 1),),
    "nature_cnn": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
}


def image_input(obs, channels_first: bool = False):
    """float32 images [..., H, W, C] of observations: [..., C, H, W] moved to channels last with
    `channels_first`; uint8 frames scaled to [0, 1] (x / 255, as the Nature DQN reads Atari's),
    other dtypes cast."""
    if channels_first:
        obs = jnp.moveaxis(obs, -3, -1)
    if obs.dtype == jnp.uint8:
        return obs.astype(jnp.float32) * (1.0 / 255.0)
    return jnp.asarray(obs, jnp.float32)


def cnn(
    layers,
    x,
    convs: Sequence[tuple[int, int, int]],
    hidden: Sequence[int],
    act: str = "relu",
    layer_norm: bool = False,
):
    """Conv layers h <- act(conv(h)) ((features, kernel, stride) each, VALID padding, gain sqrt(2)
    under the orthogonal init) on images x [..., H, W, C] (any leading batch dims, none included),
    flattened, then the `hidden` dense layers: features [..., F]. With `layer_norm`, every layer is
    h <- act(LayerNorm(...)) (over the channels after a conv)."""
    f = activation(act)
    batch = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    for features, kernel, stride in convs:
        x = layers.conv(x, features, kernel, stride)
        x = f(layers.layer_norm(x) if layer_norm else x)
    return mlp(layers, x.reshape(batch + (-1,)), hidden, act, layer_norm=layer_norm)


def cnn_output_shape(torso: str, obs_space, channels_first: bool = False) -> tuple[int, int, int]:
    """(height, width, channels) after the conv stack of `torso` on `obs_space`'s images ([C, H, W]
    with `channels_first`); ValueError if the observations are not images [H, W, C] or are smaller
    than the stack's receptive field."""
    shape = tuple(getattr(obs_space, "shape", ()) or ())
    layout = "[channels, height, width]" if channels_first else "[height, width, channels]"
    if obs_space is None or type(obs_space).__name__ != "Box" or len(shape) != 3:
        raise ValueError(
            f"torso {torso!r} needs image observations, a Box of shape {layout}; got {obs_space}"
        )
    if channels_first:
        shape = shape[1:] + shape[:1]
    height, width, channels = shape
    for features, kernel, stride in CNN_LAYERS[torso]:
        if min(height, width) < kernel:
            hint = ""
            if not channels_first and shape[0] < shape[2]:
                hint = " (frames stacked channels first? agent.network.channels_first: true)"
            raise ValueError(
                f"torso {torso!r}: images of {shape[0]}x{shape[1]} are too small for its "
                f"{kernel}x{kernel} conv layers {CNN_LAYERS[torso]}{hint}"
            )
        height, width, channels = (
            (height - kernel) // stride + 1,
            (width - kernel) // stride + 1,
            features,
        )
    return height, width, channels
