"""Packed storage: a pytree of per-item leaves laid out as a few 2-D blocks [capacity, width], one
row per item, so a batch is written with one scatter and read with one gather per block, whatever
the number of leaves (`storage_layout`, `pack`, `unpack`). For DQN on CartPole that is one block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SMALL_LEAF = 16  # most elements per item of a narrow-dtype leaf packed into the 32-bit block


@dataclass(frozen=True)
class LeafSlot:
    """Where one leaf of an item lives: columns [start, start + prod(shape)) of block `block`."""

    block: int
    start: int
    shape: tuple[int, ...]
    dtype: str


@jax.tree_util.register_static
@dataclass(frozen=True)
class StorageLayout:
    """How an item pytree is packed into 2-D blocks (static: no arrays, hashable)."""

    treedef: Any
    slots: tuple[LeafSlot, ...]
    block_dtypes: tuple[str, ...]
    block_widths: tuple[int, ...]


def storage_layout(item) -> StorageLayout:
    """The packing of one item pytree: leaves of a 32-bit dtype are stored bit for bit in one
    uint32 block; leaves of a narrower dtype (bool, 8- and 16-bit ints and floats) join that block,
    their bits widened, when they hold at most `SMALL_LEAF` elements per item, and otherwise share
    a block of their own dtype (a bool image stays one byte per pixel); any other dtype (64-bit)
    gets a block of its own dtype. Float leaves outside the uint32 block are stored as the unsigned
    ints of their width, so every bit survives."""
    leaves, treedef = jax.tree.flatten(item)
    block_dtypes, widths, slots = ["uint32"], [0], []
    for leaf in leaves:
        shape, dtype = tuple(jnp.shape(leaf)), np.dtype(jnp.asarray(leaf).dtype)
        size = int(np.prod(shape))
        if dtype.itemsize == 4 or (dtype.itemsize < 4 and size <= SMALL_LEAF):
            block = 0
        else:
            stored = _stored_dtype(dtype)
            if stored not in block_dtypes[1:]:
                block_dtypes.append(stored)
                widths.append(0)
            block = block_dtypes.index(stored, 1)
        slots.append(LeafSlot(block, widths[block], shape, dtype.name))
        widths[block] += size
    if not any(s.block == 0 for s in slots):  # no leaf in the 32-bit block
        slots = [LeafSlot(s.block - 1, s.start, s.shape, s.dtype) for s in slots]
        block_dtypes, widths = block_dtypes[1:], widths[1:]
    return StorageLayout(treedef, tuple(slots), tuple(block_dtypes), tuple(widths))


def _bits_type(dtype: np.dtype):
    """The unsigned int type of the same width as `dtype` (bool: uint8)."""
    return {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[dtype.itemsize]


def _stored_dtype(dtype: np.dtype) -> str:
    """The dtype of the block a leaf outside the uint32 block lives in: its own, or for floating
    dtypes the unsigned int of their width (a scatter or gather of a narrow float may pass through
    float32 and quiet a signalling NaN; integers keep every bit)."""
    if jnp.issubdtype(dtype, jnp.floating):
        return np.dtype(_bits_type(dtype)).name
    return dtype.name


def _to_block(x, dtype: np.dtype, block_dtype: str):
    """x as the block's dtype, bit for bit: a leaf of the uint32 block is bitcast to the unsigned
    int of its width (bool: 0 or 1), then widened to uint32; other blocks hold the leaf's own dtype
    or, for floats, its bits (`_stored_dtype`). Only integer conversions, so float NaN payloads and
    signed zeros survive."""
    if block_dtype != "uint32":
        return x if block_dtype == dtype.name else jax.lax.bitcast_convert_type(x, block_dtype)
    bits = (
        x.astype(jnp.uint8)
        if dtype == np.bool_
        else jax.lax.bitcast_convert_type(x, _bits_type(dtype))
    )
    return bits.astype(jnp.uint32)


def _from_block(x, dtype: np.dtype, block_dtype: str):
    """The inverse of `_to_block`."""
    if block_dtype != "uint32":
        return x if block_dtype == dtype.name else jax.lax.bitcast_convert_type(x, dtype)
    if dtype == np.bool_:
        return x != 0
    return jax.lax.bitcast_convert_type(x.astype(_bits_type(dtype)), dtype)


def pack(layout: StorageLayout, items) -> tuple:
    """The blocks [..., width] holding a batch of items (every leaf [..., *shape]: any leading
    axes)."""
    parts = [[] for _ in layout.block_dtypes]
    for slot, x in zip(layout.slots, layout.treedef.flatten_up_to(items)):
        x = jnp.asarray(x).astype(slot.dtype)
        lead_shape = x.shape[: x.ndim - len(slot.shape)]
        parts[slot.block].append(
            _to_block(x, np.dtype(slot.dtype), layout.block_dtypes[slot.block]).reshape(
                lead_shape + (int(np.prod(slot.shape)),)
            )
        )
    return tuple(jnp.concatenate(p, axis=-1) if len(p) > 1 else p[0] for p in parts)


def unpack(layout: StorageLayout, blocks):
    """The item pytree of blocks [..., width]: every leaf [..., *shape] (slices of the blocks)."""
    leaves = []
    for slot in layout.slots:
        block = blocks[slot.block]
        columns = block[..., slot.start : slot.start + int(np.prod(slot.shape))]
        leaves.append(
            _from_block(columns, np.dtype(slot.dtype), layout.block_dtypes[slot.block]).reshape(
                block.shape[:-1] + slot.shape
            )
        )
    return layout.treedef.unflatten(leaves)
