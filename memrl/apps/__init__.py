"""Applications built on the memrl core, through its public names only: `ask` (answer a
question about documents of any length), `serve` (the OpenAI-compatible endpoint), `view`
(a run's trajectories as one HTML page) and `quickstart` (the first run: data, a tiny model,
warm start, training and evaluation). The core never imports this package
(tests/test_layering.py)."""
