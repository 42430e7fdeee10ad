"""The actor-learner architecture, for envs outside JAX (envpool, gymnasium): `actor` threads step
`host_envs` and act on actor devices, `exchange` carries rollouts to the `learner` and
parameters back, `pieces` are each agent's acting and learning functions, `programs` their
compiled forms and `frame_stack` stacks frames on the device. Imports `rl.config`, `rl.core`,
`rl.nn`, `rl.replay`, `rl.fused` and `rl.agents`.
"""


def __getattr__(name: str):
    """`rl.sebulba.train`, the learner's `train(config)`, imported on first use."""
    if name == "train":
        from rl.sebulba.learner import train

        return train
    raise AttributeError(f"module 'rl.sebulba' has no attribute {name!r}")
