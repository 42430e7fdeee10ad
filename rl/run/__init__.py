"""A training run on the host: `train` (the loop between compiled chunks: log, checkpoint,
signals) and `actor_learner` (the same for the actor-learner architecture), `programs` (seeds
and settings as one program), `distributed` (devices and hosts), the run directory (`run_dir`,
`run_files`), `checkpoint`, `logging` and its sinks, `summary`, and the compilation caches.
Imports every package below it; only `rl.cli` imports it.
"""
