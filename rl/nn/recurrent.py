"""Recurrent torsos: GRU and LSTM cells over time-major sequences, with the carry reset where an
episode begins (`RecurrentTorso`; `rl.nn.networks.recurrent_actor_critic` puts heads on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from rl.nn.layers import constant_init, mlp, preprocess_obs


def _blockwise_orthogonal(blocks: int) -> Callable:
    """Initialiser of an [H, blocks * H] recurrent kernel: `blocks` independent orthogonal H x H
    blocks side by side (one per gate, as Flax's and PyTorch's cells initialise each gate's
    kernel)."""

    def init(key, shape, dtype=jnp.float32):
        size = shape[0]
        keys = jax.random.split(key, blocks)
        return jnp.concatenate(
            [jax.nn.initializers.orthogonal()(k, (size, size), dtype) for k in keys], axis=-1
        )

    return init


def _gru_step(h, inputs, w_h, b_hn):
    """One GRU step (Cho et al. 2014, the cuDNN / Flax `GRUCell` form) from the input projection
    x W_i + b_i = inputs = [i_r, i_z, i_n]:

        r = sigmoid(i_r + h W_hr),  z = sigmoid(i_z + h W_hz),  n = tanh(i_n + r (h W_hn + b_hn)),
        h' = (1 - z) n + z h."""
    i_r, i_z, i_n = jnp.split(inputs, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(h @ w_h, 3, axis=-1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * (h_n + b_hn))
    return (1.0 - z) * n + z * h


def _lstm_step(carry, inputs, w_h):
    """One LSTM step (Hochreiter & Schmidhuber 1997) from the input projection x W_i + b_i = inputs
    = [i_i, i_f, i_g, i_o], carry (h, c):

        i = sigmoid(i_i + h W_hi),  f = sigmoid(i_f + h W_hf + 1),  g = tanh(i_g + h W_hg),
        o = sigmoid(i_o + h W_ho),  c' = f c + i g,  h' = o tanh(c')

    (the forget gate's +1, as Haiku's LSTM and Jozefowicz et al. 2015: remember by default)."""
    h, c = carry
    gates = inputs + h @ w_h
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jnp.tanh(c) * jax.nn.sigmoid(o), c


@dataclass(frozen=True)
class RecurrentTorso:
    """A GRU or LSTM torso over time-major sequences, as a pure function of the carry:

        carry, features = torso(layers, carry, obs, reset)
        obs [T, *batch, ...], reset [T, *batch] (bool), carry: `initial_carry(batch)`-shaped,
        features [T, *batch, size] (the hidden state h_t after each step),
        carry = the state after step T-1

    Per step t: the carry is first put back to the initial state where `reset[t]` (obs[t] begins an
    episode), then the cell reads x_t = mlp(obs[t]) (the `hidden` layers; none: the observation
    itself). The input projections x_t W_i + b_i of all T steps are one matmul before a `lax.scan`
    runs the recurrence (gates in `_gru_step` / `_lstm_step`); `layer_norm` as the mlp torso's.
    Built with `layers.build`, it is `apply(params, carry, obs, reset) -> (carry, features)` on
    either backend, with the same parameters: dense layers through `layers.dense` (input side, gain
    1 under the orthogonal init) and the recurrent kernel [size, gates * size] (one orthogonal block
    per gate) and GRU's candidate bias through `layers.param`. For a single step pass T = 1
    (obs[None], reset[None])."""

    cell: str  # "gru" or "lstm"
    size: int
    hidden: tuple[int, ...] = ()
    activation: str = "relu"
    num_discrete_obs: int | None = None
    layer_norm: bool = False  # LayerNorm in the layers before the cell

    def initial_carry(self, batch=()):
        """The state every episode starts from: zeros [*batch, size] (GRU: h), or a pair (h, c) of
        them (LSTM). `batch` is an int or a shape."""
        shape = ((batch,) if isinstance(batch, int) else tuple(batch)) + (self.size,)
        zeros = jnp.zeros(shape, jnp.float32)
        return zeros if self.cell == "gru" else (zeros, zeros)

    def __call__(self, layers, carry, obs=None, reset=None):
        if obs is None or reset is None:
            raise TypeError(
                f"a recurrent ({self.cell}) torso is called as torso(layers, carry, obs, reset); "
                "feedforward combinators (with_head, actor_critic, twin_q) cannot carry its state: "
                "use recurrent_actor_critic"
            )
        x = mlp(
            layers,
            preprocess_obs(obs, self.num_discrete_obs),
            self.hidden,
            self.activation,
            layer_norm=self.layer_norm,
        )
        gates = 3 if self.cell == "gru" else 4
        inputs = layers.dense(x, gates * self.size, scale=1.0)
        name = _fresh_name(layers, self.cell)
        w_h = layers.param(
            f"{name}_recurrent_kernel", (self.size, gates * self.size), _blockwise_orthogonal(gates)
        )
        b_hn = (
            layers.param(f"{name}_candidate_bias", (self.size,), constant_init(0.0))
            if self.cell == "gru"
            else None
        )

        def step(carry, step_inputs):
            inputs_t, reset_t = step_inputs
            carry = jax.tree.map(
                lambda c: jnp.where(reset_t[..., None], jnp.zeros_like(c), c), carry
            )
            if self.cell == "gru":
                carry = _gru_step(carry, inputs_t, w_h, b_hn)
                return carry, carry
            carry = _lstm_step(carry, inputs_t, w_h)
            return carry, carry[0]

        return jax.lax.scan(step, carry, (inputs, jnp.asarray(reset, jnp.bool_)))


def _fresh_name(layers, prefix: str) -> str:
    """`prefix_i`, i counting the recurrent cells built so far with these `layers` (two torsos: two
    cells)."""
    count = getattr(layers, "recurrent_count", 0)
    layers.recurrent_count = count + 1
    return f"{prefix}_{count}"
