"""Replay: `buffers` (uniform and prioritised ring buffers over seeds, n-step transitions) and
`loop` (the collect-store-sample-learn loop DQN and Rainbow share). Imports `rl.config`,
`rl.core` and `rl.nn`.
"""
