"""Local objectives, one module per method (FL-bench's "file = method"); FedAvg is the base
`incofl.fl.client.Objective`."""

from incofl.fl.objectives.exits import ExitLoss
from incofl.fl.objectives.fedprox import FedProx
from incofl.fl.objectives.masked import MaskedCE
from incofl.fl.objectives.moon import Moon
from incofl.fl.objectives.scaffold import Scaffold

__all__ = ["ExitLoss", "FedProx", "MaskedCE", "Moon", "Scaffold"]
