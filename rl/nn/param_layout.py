"""Where a network's parameters are, for code that reads them by position rather than by name: the
fused kernels, which read the weights from the optimiser's flat parameter vector
(`jax.flatten_util.ravel_pytree`), and tests that recompute a network by hand.

`dense_layers(params)` lists the (weight, bias) pairs of a network of plain dense layers in creation
order, for either backend; `leaf_offsets(params)` gives where each leaf starts in the flat vector,
so `dense_layers(leaf_offsets(params))` gives each dense layer's (weight, bias) offsets."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

_WEIGHT_NAMES, _BIAS_NAMES = ("kernel", "w"), ("bias", "b")


def _layer_index(module_name: str) -> int:
    """Creation index of a flax `Dense_3` / haiku `linear_3` module (`linear` alone is 0)."""
    head, _, tail = module_name.rpartition("_")
    return int(tail) if head and tail.isdigit() else 0


def dense_layers(params) -> list[tuple[jax.Array, jax.Array]]:
    """The (weight [in, out], bias [out]) pairs of a network of plain dense layers, in creation
    order, for either backend (flax `Dense_i/{kernel,bias}`, haiku `linear_i/{w,b}`). ValueError if
    the tree holds anything else (e.g. a learned log-std or noisy layers)."""
    modules = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        module, name = keys[-2] if len(keys) >= 2 else None, keys[-1]
        if module is None or name not in _WEIGHT_NAMES + _BIAS_NAMES:
            raise ValueError(
                f"dense_layers: parameter {'/'.join(map(str, keys))} is not a dense layer's "
                "weight or bias"
            )
        modules.setdefault(module, {})["w" if name in _WEIGHT_NAMES else "b"] = leaf
    ordered = sorted(modules, key=_layer_index)
    return [(modules[m]["w"], modules[m]["b"]) for m in ordered]


def leaf_offsets(params):
    """`params` with each leaf replaced by where it starts in
    `jax.flatten_util.ravel_pytree(params)`'s vector (an int): leaf k starts at the sum of the sizes
    of leaves 0..k-1, in `jax.tree` order. `dense_layers(leaf_offsets(params))` gives each dense
    layer's (weight, bias) offsets."""
    leaves, treedef = jax.tree.flatten(params)
    sizes = [math.prod(jnp.shape(x)) for x in leaves]
    return jax.tree.unflatten(treedef, [0, *itertools.accumulate(sizes)][: len(leaves)])
