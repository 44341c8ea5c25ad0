"""Reference networks and the bundled digits data (the demo, the benchmarks and the tests).

Installed as ``lossscale_models`` (the repository keeps it in ``models/``): never under a generic
top-level name, so a project with its own ``models`` package or ``models.py`` is not shadowed.
"""

from .data import NUM_CLASSES, load_digits, make_dataset, to_layout, train_test_split
from .networks import MLP, MODELS, LeNet5, SmallResNet, TinyTransformer, create_model

__all__ = [
    "MODELS",
    "MLP",
    "LeNet5",
    "NUM_CLASSES",
    "SmallResNet",
    "TinyTransformer",
    "create_model",
    "load_digits",
    "make_dataset",
    "to_layout",
    "train_test_split",
]
