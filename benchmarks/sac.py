"""SAC: learning curves over many seeds and training throughput (same method as benchmarks/ppo.py).

    python benchmarks/sac.py learning --config configs/sac_pendulum.yaml --seeds 8 \\
        --threshold -200 --budget 20000
    python benchmarks/sac.py throughput --config configs/sac_pendulum.yaml --seeds 1,8 \\
        [agent.total_steps=5000] [--json out.json]

`learning` prints per log point the median and IQR of the greedy evaluation return ("eval_return":
`eval_episodes` deterministic episodes run inside the program at each log point) over seeds, the
fraction of seeds at or above the threshold at that point and the fraction that reached it so far,
then the verdict at `--budget` env steps. `throughput` times the whole program (env steps, replay,
`utd_ratio` gradient steps per env step, evaluation) per number of vmapped seeds, compile apart.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo import main  # noqa: E402  (the PPO script's runner is agent-agnostic)

if __name__ == "__main__":
    main()
