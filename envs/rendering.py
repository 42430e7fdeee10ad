"""rgb_array frames drawn with NumPy (no display, no pygame), and GIFs of them.

    frame = envs.render(env, state, params)          # uint8 [H, W, 3]
    envs.save_gif([frame, ...], "episode.gif", fps=30)

Each renderable env has a `render(state, params) -> np.ndarray` method drawing one (unbatched)
state; `render` here peels wrappers and picks one env out of a vectorised state. The primitives
work in pixel coordinates (x to the right, y down) on a float canvas and fill whole pixels whose
centres fall inside a shape (no anti-aliasing).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)


def canvas(height: int, width: int, color=WHITE) -> np.ndarray:
    """A blank uint8 [height, width, 3] image."""
    image = np.empty((int(height), int(width), 3), np.uint8)
    image[:] = np.asarray(color, np.uint8)
    return image


def _pixel_grid(image: np.ndarray, xs: np.ndarray, ys: np.ndarray):
    """Integer bounding box of the points clipped to the image and the pixel centres inside it."""
    h, w = image.shape[:2]
    x0, x1 = max(int(np.floor(xs.min())), 0), min(int(np.ceil(xs.max())), w - 1)
    y0, y1 = max(int(np.floor(ys.min())), 0), min(int(np.ceil(ys.max())), h - 1)
    if x0 > x1 or y0 > y1:
        return None
    py, px = np.mgrid[y0 : y1 + 1, x0 : x1 + 1] + 0.5
    return (slice(y0, y1 + 1), slice(x0, x1 + 1)), px, py


def fill_polygon(image: np.ndarray, points: Sequence[Sequence[float]], color) -> np.ndarray:
    """Fill the polygon with vertices `points` [(x, y), ...] (even-odd rule) in place."""
    points = np.asarray(points, np.float64)
    grid = _pixel_grid(image, points[:, 0], points[:, 1])
    if grid is None:
        return image
    window, px, py = grid
    inside = np.zeros(px.shape, bool)
    for (xa, ya), (xb, yb) in zip(points, np.roll(points, -1, axis=0)):
        crosses = (ya > py) != (yb > py)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = xa + (py - ya) * (xb - xa) / (yb - ya)
        inside ^= crosses & (px < x_cross)
    image[window][inside] = np.asarray(color, np.uint8)
    return image


def fill_circle(image: np.ndarray, center: Sequence[float], radius: float, color) -> np.ndarray:
    """Fill the disc of `radius` pixels around `center` (x, y) in place."""
    cx, cy = float(center[0]), float(center[1])
    grid = _pixel_grid(
        image, np.array([cx - radius, cx + radius]), np.array([cy - radius, cy + radius])
    )
    if grid is None:
        return image
    window, px, py = grid
    image[window][(px - cx) ** 2 + (py - cy) ** 2 <= radius**2] = np.asarray(color, np.uint8)
    return image


def draw_line(
    image: np.ndarray, start: Sequence[float], end: Sequence[float], width: float, color
) -> np.ndarray:
    """A segment of `width` pixels from `start` to `end` (a filled rectangle), in place."""
    start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    direction = end - start
    length = np.hypot(*direction)
    if length == 0:
        return fill_circle(image, start, width / 2, color)
    normal = np.array([-direction[1], direction[0]]) / length * (width / 2)
    return fill_polygon(image, [start + normal, end + normal, end - normal, start - normal], color)


def draw_polyline(
    image: np.ndarray, points: Sequence[Sequence[float]], width: float, color
) -> np.ndarray:
    """Consecutive segments through `points`, in place."""
    points = np.asarray(points, np.float64)
    for a, b in zip(points[:-1], points[1:]):
        draw_line(image, a, b, width, color)
    return image


def rotated_rectangle(
    center, length: float, width: float, angle: float, anchor: str = "center"
) -> np.ndarray:
    """Corners of a length x width rectangle rotated by `angle`
    (radians, counter-clockwise on screen).

    With anchor="start" the rectangle starts at `center` and extends `length` along the angle.
    """
    cx, cy = center
    along = np.array([np.cos(angle), -np.sin(angle)])  # screen y points down
    across = np.array([np.sin(angle), np.cos(angle)]) * (width / 2)
    start = np.array([cx, cy], np.float64) - (along * length / 2 if anchor == "center" else 0.0)
    end = start + along * length
    return np.array([start + across, end + across, end - across, start - across])


def _to_numpy(tree: Any) -> Any:
    """NumPy leaves; typed PRNG keys (which NumPy cannot hold) stay JAX arrays."""
    return jax.tree.map(
        lambda x: (
            x
            if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)
            else np.asarray(x)
        ),
        tree,
    )


def render(env, state: Any, params: Any = None, index: int | None = None) -> np.ndarray:
    """An rgb_array frame (uint8 [H, W, 3]) of one env's state.

    Wrappers are peeled off; for a vectorised (batched) state, `index` picks the env to draw (it is
    required then). Raises ValueError for an env without a `render` method.
    """
    from envs.wrappers import unwrap_state

    base, inner = unwrap_state(env, state)
    params = base.default_params if params is None else params
    if not hasattr(base, "render"):
        raise ValueError(f"{base.name} has no render method")
    if not hasattr(inner, "time"):
        raise ValueError(
            f"render: got a {type(inner).__name__} for the env {base.name}, "
            f"which is not a state of {type(base).__name__}; "
            "pass the env the state came from (the wrapped env), "
            "e.g. envs.render(wrapped_env, state, params, index=0)"
        )
    inner = _to_numpy(inner)
    batched = np.ndim(inner.time) > 0
    if batched and index is None:
        raise ValueError(
            f"render: the state holds a batch of envs {np.shape(inner.time)}; "
            "pass index= to pick one"
        )
    if index is not None:
        inner = jax.tree.map(lambda x: x[index], inner) if batched else inner
    return base.render(inner, params)


def save_gif(frames: Sequence[np.ndarray], path: str, fps: float = 30) -> str:
    """Write uint8 [H, W, 3] frames as a looping GIF at `fps` frames per second (needs Pillow)."""
    from PIL import Image

    frames = [np.asarray(f) for f in frames]
    if not frames:
        raise ValueError("save_gif: no frames")
    for i, f in enumerate(frames):
        if f.dtype != np.uint8 or f.ndim != 3 or f.shape[2] != 3:
            raise ValueError(
                f"save_gif: frame {i} must be uint8 [H, W, 3], got {f.dtype} {f.shape}"
            )
    images = [Image.fromarray(f) for f in frames]
    images[0].save(
        path, save_all=True, append_images=images[1:], duration=int(round(1000 / fps)), loop=0
    )
    return str(path)
