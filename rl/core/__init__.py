"""The building blocks every agent composes, values in and values out: `losses` (one pure function
per RL idea), `collection` and `rollout` (stepping envs), `minibatches`, `optimizers`,
`exploration`, `episodes` and `log_points` (episode returns and the metrics of a log point),
`observation_norm`, `packing`, `state` (the typed training state), `environment` (making the
config's env and checking it fits an agent) and `precision`. Imports only `rl.config` (and `envs`,
`kernels`).
"""
