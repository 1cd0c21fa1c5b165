"""Training recipes: short, top-to-bottom functions that compose the library.

`grpo.train(config)` is GRPO-family RL; `config.TrainConfig` is its typed config. Recipes may
import every package (they are where agents, tasks, engines and `memrl.rl` meet); the
library packages never import a recipe.
"""
