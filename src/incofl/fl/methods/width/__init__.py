"""Width and depth splitting: HeteroFL (Diao et al., ICLR 2021), FedRolex (Alam et al., NeurIPS
2022), ScaleFL (Ilhan et al., CVPR 2023). levels.py: the levels, their plans, layout and
evaluation; aggregate.py: the per-element means; slicing.py: a sub-model's place in the global
model; masked.py and exits.py: the local objectives (masked cross-entropy, ScaleFL's exit loss)."""
