"""rl.rollout.completed_episodes against a step-by-step float64 NumPy accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.rollout import completed_episodes


def sequential(rewards, dones, running_return, running_length):
    """The obvious loop: add each reward, close the episode where done."""
    ret, length = running_return.astype(np.float64).copy(), running_length.astype(np.int64).copy()
    sum_return, sum_length, episodes = 0.0, 0, 0
    for t in range(rewards.shape[0]):
        ret += rewards[t]
        length += 1
        sum_return += ret[dones[t]].sum()
        sum_length += length[dones[t]].sum()
        episodes += int(dones[t].sum())
        ret[dones[t]], length[dones[t]] = 0.0, 0
    return sum_return, sum_length, episodes, ret, length


@settings(max_examples=50, deadline=None)
@given(steps=st.integers(1, 24), envs=st.integers(1, 5), done_rate=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_matches_the_step_by_step_accumulation(steps, envs, done_rate, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    dones = rng.random((steps, envs)) < done_rate
    running_return = rng.normal(size=envs).astype(np.float32) * 10
    running_length = rng.integers(0, 100, envs).astype(np.int32)
    got = completed_episodes(jnp.asarray(rewards), jnp.asarray(dones), jnp.asarray(running_return), jnp.asarray(running_length))
    want = sequential(rewards, dones, running_return, running_length)
    np.testing.assert_allclose(float(got[0]), want[0], rtol=1e-5, atol=1e-4)
    assert int(got[1]) == want[1] and int(got[2]) == want[2]
    np.testing.assert_allclose(np.asarray(got[3]), want[3], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(got[4]), want[4])


def test_hand_made_rollout():
    """One env, 5 steps, rewards 1..5, episodes end after steps 1 and 4; 10 already earned over 3 steps."""
    rewards = jnp.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    dones = jnp.array([[False], [True], [False], [False], [True]])
    sum_return, sum_length, episodes, carry_return, carry_length = completed_episodes(rewards, dones, jnp.array([10.0]), jnp.array([3]))
    assert float(sum_return) == (10 + 1 + 2) + (3 + 4 + 5)
    assert int(sum_length) == (3 + 2) + 3 and int(episodes) == 2
    assert float(carry_return[0]) == 0.0 and int(carry_length[0]) == 0


def test_no_episode_end_carries_everything_and_works_under_jit_vmap():
    rewards = jnp.ones((4, 3, 2))  # [steps, seeds, envs] with the seed axis vmapped
    dones = jnp.zeros((4, 3, 2), bool)
    f = jax.jit(jax.vmap(completed_episodes, in_axes=(1, 1, 0, 0)))
    sum_return, sum_length, episodes, carry_return, carry_length = f(rewards, dones, jnp.full((3, 2), 2.0), jnp.full((3, 2), 7))
    np.testing.assert_array_equal(np.asarray(episodes), 0)
    np.testing.assert_array_equal(np.asarray(sum_return), 0.0)
    np.testing.assert_array_equal(np.asarray(carry_return), 6.0)
    np.testing.assert_array_equal(np.asarray(carry_length), 11)
