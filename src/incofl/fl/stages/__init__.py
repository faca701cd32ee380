"""The generic stages of a round and the base classes a method's components extend: plan
(plan.py), a local objective in two halves (objective.py), local training (local.py, trainer.py, batched.py), transforms
(transforms.py), aggregation and apply (aggregate.py), observers and the analyses' probes
(observers.py, probes.py), evaluation (evaluation.py), and the model layout (layout.py). They
import no method (an import-linter contract)."""
