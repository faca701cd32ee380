"""The objective-only methods, a local objective each, one module per method (FL-bench's "file
= method"): FedProx, SCAFFOLD, MOON. FedAvg's is the base `incofl.fl.stages.objective.Objective`; the
width family's (masked cross-entropy, ScaleFL's exit loss) live in `incofl.fl.methods.width`."""
