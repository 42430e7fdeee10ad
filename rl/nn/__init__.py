"""Networks as pairs of pure functions `init(key, obs) -> params`, `apply(params, obs)`: `layers`
(dense layers, the Flax/Haiku backends), torsos (`cnn`, `recurrent`, `simbav2`, batch
renormalisation), `networks` (torsos plus heads: Q, dueling, distributional, noisy, categorical,
Gaussian, value), `mixers` (QMIX), `multi_agent` (the agents axis), `param_layout` (where a flat
parameter vector holds each array) and `network_config` (`agent.network`). Imports `rl.config`
and `rl.core`.
"""
