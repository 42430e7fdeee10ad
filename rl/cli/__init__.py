"""The `rl` command line (`main`) and what its subcommands do beyond training: `evaluate`,
`plot`, `compare` and the statistics of `evaluation` (IQM with bootstrap confidence intervals).
The top layer.
"""
