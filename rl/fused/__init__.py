"""Adapters from networks to the fused Triton kernels of `kernels`: `q` (DQN's Q-network
gradient and Adam step), `rainbow` (Rainbow's) and `critic` (the twin critics and actor of SAC and
TD3), each with the rule that says whether a config fits the kernel. Imports `rl.config`,
`rl.core` and `rl.nn`.
"""
