"""Conv torsos for image observations: a conv stack (`CNN_LAYERS`: MinAtar's net, Nature DQN's)
on float32 images [..., H, W, C], flattened, then the dense `hidden` layers
(`rl.networks.make_torso` builds one for `agent.network.torso: cnn_minatar | nature_cnn`).
"""

from __future__ import annotations

from typing import Sequence

from rl.layers import activation, mlp

# Conv stacks of the cnn torsos, (features, kernel, stride) per layer, VALID padding; the dense
# layers after them are `agent.network.hidden`: MinAtar's net (Young & Tian 2019), then hidden
# [128]; Nature DQN's (Mnih et al. 2015), then hidden [512].
CNN_LAYERS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "cnn_minatar": ((16, 3, 1),),
    "nature_cnn": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
}


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


def cnn_output_shape(torso: str, obs_space) -> tuple[int, int, int]:
    """(height, width, channels) after the conv stack of `torso` on `obs_space`'s images; ValueError
    if the observations are not images [H, W, C] or are smaller than the stack's receptive field."""
    shape = tuple(getattr(obs_space, "shape", ()) or ())
    if obs_space is None or type(obs_space).__name__ != "Box" or len(shape) != 3:
        raise ValueError(
            f"torso {torso!r} needs image observations, a Box of shape [height, width, channels]; "
            f"got {obs_space}"
        )
    height, width, channels = shape
    for features, kernel, stride in CNN_LAYERS[torso]:
        if min(height, width) < kernel:
            raise ValueError(
                f"torso {torso!r}: images of {shape[0]}x{shape[1]} are too small for its "
                f"{kernel}x{kernel} conv layers {CNN_LAYERS[torso]}"
            )
        height, width, channels = (
            (height - kernel) // stride + 1,
            (width - kernel) // stride + 1,
            features,
        )
    return height, width, channels
