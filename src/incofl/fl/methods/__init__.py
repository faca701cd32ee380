"""The method families, one package each, holding a torch-free `spec.py` (its parameter models
and its methods' registry entries, which incofl.registry collects) and its stage components:
avg (FedAvg, HeteroAvg: generic components only), objectives (FedProx, SCAFFOLD, MOON), fednova,
inco (InCoAvg and its ablations; `with_inco` composes the InCo step with the other families'
methods), fedpart, personal (Local, FedPer, FedLAG) and width (HeteroFL, FedRolex, ScaleFL). A
method builds on the stages' base classes (incofl.fl.stages). Nothing on a spec's import path
imports torch."""
