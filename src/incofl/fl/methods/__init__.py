"""The method families, each in one module or folder holding all of its stage components:
InCo (inco.py), FedNova (fednova.py), FedPart (fedpart.py), the personal methods (personal.py:
Local, FedPer, FedLAG), width splitting (width/: HeteroFL, FedRolex, ScaleFL) and the
objective-only methods (objectives/: FedProx, SCAFFOLD, MOON). The registry (registry.py)
names each method's components; a method builds on the stages' base classes."""
