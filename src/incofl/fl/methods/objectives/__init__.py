"""The local objectives of the objective-only methods, one module each (FL-bench's "file =
method"): FedProx, SCAFFOLD, MOON. FedAvg's is the base `incofl.fl.stages.local.Objective`; the
width family's (masked cross-entropy, ScaleFL's exit loss) live in `incofl.fl.methods.width`."""

from incofl.fl.methods.objectives.fedprox import FedProx
from incofl.fl.methods.objectives.moon import Moon
from incofl.fl.methods.objectives.scaffold import Scaffold

__all__ = ["FedProx", "Moon", "Scaffold"]
