"""Reference networks and the bundled digits data, used by the demo, the benchmarks and the tests."""
from models.data import NUM_CLASSES, load_digits, make_dataset, to_layout, train_test_split
from models.networks import MODELS, MLP, LeNet5, SmallResNet, TinyTransformer, create_model

__all__ = ["MODELS", "MLP", "LeNet5", "NUM_CLASSES", "SmallResNet", "TinyTransformer", "create_model",
           "load_digits", "make_dataset", "to_layout", "train_test_split"]
