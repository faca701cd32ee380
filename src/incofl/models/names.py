"""Model names: the one home of every architecture name the configs, the registry's checks and
the studies use. Torch-free, so that a config is validated without importing the models."""

RESNETS = ("resnet10", "resnet14", "resnet18", "resnet22", "resnet26")  # the InCo paper's nested family
VITS = ("vit_d8", "vit_d9", "vit_d10", "vit_d11", "vit_d12")  # its ViT family (depths 8-12)
FAMILIES = {"resnet": RESNETS, "vit": VITS}  # the case study's model families
# resnet8: FedPart's poster model (3 stages), not in the nested family; cnn20: FedLAG's 6-conv CNN;
# preresnet18 and resnet110: cut in width (HeteroFL, FedRolex) and in width and depth (ScaleFL)
WIDTH_MODELS = ("preresnet18", "resnet110")
LAYER_GROUP_MODELS = ("resnet8", *RESNETS)  # the models FedPart's layer groups are defined for
MODELS = ("resnet8", *RESNETS, *VITS, "cnn20", *WIDTH_MODELS)
EXIT_MODEL = "resnet110"  # the width model with early exits (ScaleFL)
EXITS = 4  # resnet110: three early exits and the final classifier
# each model group's (width rate, deepest exit) when `width_rates` is unset: HeteroFL's five
# rates, ScaleFL's four levels; exits None: no early exits
WIDTH_LEVELS = {
    "preresnet18": ([1.0, 0.5, 0.25, 0.125, 0.0625], None),
    "resnet110": ([0.7, 0.7, 0.75, 1.0], [1, 2, 3, 4]),
}
