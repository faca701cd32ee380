"""The engine: the round loop (engine.py), a run with its metrics, checkpoints and resume
(run.py), and what a run needs around it (checkpoint, run directory lock, divergence checks, the
first-round work estimate). It calls the stages and the method's components through their
interfaces and imports no method (an import-linter contract)."""
