"""rgb_array frames for every env (shape, dtype, they follow the state) and GIF writing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import envs
from envs.rendering import canvas, fill_circle, fill_polygon, render, save_gif
from envs.wrappers import EpisodeStatistics, NormalizeObservation, vectorize

SHAPES = {
    "GridWorld": (200, 200, 3),
    "CartPole-v1": (400, 600, 3),
    "Pendulum-v1": (500, 500, 3),
    "MountainCar-v0": (400, 600, 3),
    "MountainCarContinuous-v0": (400, 600, 3),
    "Acrobot-v1": (500, 500, 3),
}


@pytest.mark.parametrize("env_id", sorted(SHAPES))
def test_frames_have_the_right_shape_and_follow_the_state(env_id):
    env, params = envs.make(env_id)
    _, state = env.reset(jax.random.key(0), params)
    frame = render(env, state, params)
    assert frame.shape == SHAPES[env_id] and frame.dtype == np.uint8
    assert (
        len(np.unique(frame.reshape(-1, 3), axis=0)) >= 3
    )  # something besides the background is drawn
    frames = [frame]
    # GridWorld: step up (from the bottom-right start, right and down hit the wall)
    action = (
        jnp.int32(1)
        if env_id == "GridWorld"
        else env.action_space(params).sample(jax.random.key(1))
    )
    for t in range(5):
        _, state, *_ = env.step(jax.random.key(t), state, action, params)
        frames.append(render(env, state, params))
    assert not np.array_equal(frames[0], frames[-1])  # the picture moves with the state


def test_frames_show_the_right_configuration():
    env, params = envs.make("GridWorld", size=3)
    _, state = env.reset(jax.random.key(0), params)
    frame = render(env, state, params)
    red = (frame[..., 0] > 180) & (frame[..., 1] < 100)
    rows, cols = np.nonzero(red)
    assert (
        rows.min() >= 80 and cols.min() >= 80
    )  # the agent in the bottom-right cell (start (2, 2))
    env, params = envs.make("CartPole-v1")
    from envs.cartpole import CartPoleState

    def pole_columns(theta):
        state = CartPoleState(*(jnp.float32(v) for v in (0.0, 0.0, theta, 0.0)), time=jnp.int32(0))
        pole = np.all(render(env, state, params) == (202, 152, 101), axis=-1)
        return np.nonzero(pole)[1].mean()

    assert (
        pole_columns(0.3) > 300 > pole_columns(-0.3)
    )  # positive theta leans right, as in gymnasium


def test_render_unwraps_and_needs_an_index_for_a_batch():
    env, params = envs.make("Pendulum-v1")
    wrapped = NormalizeObservation(EpisodeStatistics(vectorize(env, 3)))
    _, state = wrapped.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match="pass index="):
        render(wrapped, state, params)
    frames = [render(wrapped, state, params, index=i) for i in range(3)]
    assert all(f.shape == (500, 500, 3) for f in frames)
    assert not np.array_equal(frames[0], frames[1])
    single = jax.tree.map(lambda x: x[1], state.env_state.env_state)
    np.testing.assert_array_equal(frames[1], render(env, single, params))


def test_render_of_a_wrapped_state_with_the_base_env_says_which_env_to_pass():
    env, params = envs.make("Pendulum-v1")
    wrapped = NormalizeObservation(EpisodeStatistics(vectorize(env, 3)))
    _, state = wrapped.reset(jax.random.key(0), params)
    with pytest.raises(
        ValueError,
        match=(
            r"render: got a NormalizeObservationState for the env Pendulum-v1.*"
            r"pass the env the state came from"
        ),
    ):
        render(env, state, params)


def test_save_gif_round_trip(tmp_path):
    env, params = envs.make("CartPole-v1")
    obs, state = env.reset(jax.random.key(0), params)
    frames = []
    for t in range(4):
        frames.append(render(env, state, params))
        _, state, *_ = env.step(jax.random.key(t), state, jnp.int32(t % 2), params)
    path = save_gif(frames, tmp_path / "episode.gif", fps=25)
    with Image.open(path) as gif:
        assert gif.n_frames == 4 and gif.size == (600, 400)
        assert gif.info["duration"] == 40
    with pytest.raises(ValueError, match="uint8"):
        save_gif([np.zeros((4, 4, 3), np.float32)], tmp_path / "bad.gif")
    with pytest.raises(ValueError, match="no frames"):
        save_gif([], tmp_path / "empty.gif")


def test_primitives_fill_the_expected_pixels():
    image = canvas(10, 10)
    fill_polygon(image, [(2, 2), (6, 2), (6, 5), (2, 5)], (0, 0, 0))
    assert (image[..., 0] == 0).sum() == 4 * 3 and image[2:5, 2:6].max() == 0
    image = canvas(21, 21)
    fill_circle(image, (10.5, 10.5), 5, (0, 0, 0))
    assert abs((image[..., 0] == 0).sum() - np.pi * 25) < 8
    fill_polygon(
        image, [(-50, -50), (-40, -50), (-40, -40)], (1, 2, 3)
    )  # off-canvas: no error, no change
    assert not (image == (1, 2, 3)).all(-1).any()
