"""Hot ops of the agents as Triton kernels, each with a plain-JAX reference (see launch.py).

Every op takes ``backend=`` ("triton", "reference", "interpret"; "auto" or None: not chosen here);
the default comes from :func:`set_backend` / :func:`use_backend`, the FUSEDRL_KERNEL_BACKEND
environment variable, or the device (GPU with jax_triton -> "triton", else "reference"), and with
that automatic choice an op may send small shapes to XLA where it measured XLA faster.
"""

from kernels.adam import adam_step
from kernels.deterministic_policy_grads import deterministic_policy_grads_flat
from kernels.gae import gae
from kernels.launch import (
    BACKENDS,
    BackendUnavailableError,
    available_backends,
    default_backend,
    get_backend,
    resolve_backend,
    set_backend,
    use_backend,
)
from kernels.policy_head import categorical_log_prob_entropy
from kernels.ppo_grads import ppo_actor_critic_grads, ppo_actor_critic_grads_flat, ppo_objective
from kernels.projection import categorical_projection
from kernels.q_act import q_epsilon_greedy
from kernels.q_grads import q_learning_grads_flat
from kernels.q_lambda import q_lambda_returns
from kernels.rainbow_act import rainbow_epsilon_greedy
from kernels.returns import discounted_returns
from kernels.sac_actor_grads import sac_actor_grads_flat
from kernels.softmax import softmax
from kernels.sumtree import sumtree_find_leaves, sumtree_set_leaves
from kernels.twin_q_grads import twin_q_grads_flat

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "available_backends",
    "default_backend",
    "get_backend",
    "resolve_backend",
    "set_backend",
    "use_backend",
    "discounted_returns",
    "gae",
    "q_lambda_returns",
    "softmax",
    "categorical_log_prob_entropy",
    "categorical_projection",
    "ppo_actor_critic_grads",
    "ppo_actor_critic_grads_flat",
    "ppo_objective",
    "q_epsilon_greedy",
    "q_learning_grads_flat",
    "rainbow_epsilon_greedy",
    "twin_q_grads_flat",
    "deterministic_policy_grads_flat",
    "sac_actor_grads_flat",
    "sumtree_set_leaves",
    "sumtree_find_leaves",
    "adam_step",
]
