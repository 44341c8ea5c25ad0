"""Reference networks for the demo, the benchmarks and the tests.

Every network is built by a one-line constructor, takes a float32 batch in the
layout named by its ``input_layout`` attribute (see :func:`models.data.to_layout`)
and returns logits. They contain only standard MindSpore cells, so
``mindspore.amp.auto_mixed_precision`` (``amp_level`` O0/O2/O3) applies to them.

Example:
    >>> net = create_model("mlp")
    >>> net.input_layout, sum(p.size for p in net.trainable_params())
    ('flat', 51466)
"""
import math

from mindspore import Parameter, nn, ops
from mindspore.common.initializer import HeUniform, Normal, initializer

from .data import NUM_CLASSES


def _dense(in_features, out_features, seed_std=None):
    """Dense with zero bias (deterministic under ``mindspore.set_seed``)."""
    weight = Normal(seed_std) if seed_std else HeUniform(math.sqrt(5))
    return nn.Dense(in_features, out_features, weight_init=weight, bias_init="zeros")


class MLP(nn.Cell):
    """Multi-layer perceptron on flattened images: ``in -> hidden (ReLU) x depth -> classes``.

    Args:
        in_features: input size (64 for 8x8 digits, 784 for 28x28).
        hidden: width of each hidden layer.
        depth: number of hidden layers.
        num_classes: output size.

    Example:
        >>> MLP(784, 1024, 2).input_layout
        'flat'
    """

    input_layout = "flat"

    def __init__(self, in_features=64, hidden=256, depth=2, num_classes=NUM_CLASSES):
        super().__init__()
        layers = []
        width = in_features
        for _ in range(depth):
            layers += [_dense(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(_dense(width, num_classes))
        self.layers = nn.SequentialCell(layers)

    def construct(self, x):
        return self.layers(x)


class LeNet5(nn.Cell):
    """LeNet-5 on 1x32x32 images (the digits are upsampled 4x), as in MindSpore's loss-scale guide.

    Example:
        >>> LeNet5().input_layout
        'image32'
    """

    input_layout = "image32"

    def __init__(self, num_classes=NUM_CLASSES, num_channel=1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = _dense(16 * 5 * 5, 120, 0.02)
        self.fc2 = _dense(120, 84, 0.02)
        self.fc3 = _dense(84, num_classes, 0.02)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class _ResidualBlock(nn.Cell):
    """``relu(x + bn(conv(relu(bn(conv(x))))))`` with 3x3 convolutions."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, pad_mode="same")
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, pad_mode="same")
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def construct(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Cell):
    """A small ResNet on 1x8x8 images: stem conv, ``blocks`` residual blocks, global pooling, Dense.

    Example:
        >>> SmallResNet(channels=8, blocks=1).input_layout
        'image8'
    """

    input_layout = "image8"

    def __init__(self, channels=16, blocks=2, num_classes=NUM_CLASSES):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(1, channels, 3, pad_mode="same"), nn.BatchNorm2d(channels),
                                       nn.ReLU()])
        self.blocks = nn.SequentialCell([_ResidualBlock(channels) for _ in range(blocks)])
        self.head = _dense(channels, num_classes)

    def construct(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(axis=(2, 3)))


class TinyTransformer(nn.Cell):
    """A tiny Transformer encoder classifier: the 8 image rows are 8 tokens of 8 pixels.

    Linear embedding + learned positions, ``layers`` encoder layers (pre-norm),
    mean pooling over tokens, Dense head.

    Example:
        >>> TinyTransformer(d_model=16, heads=2, layers=1).input_layout
        'tokens'
    """

    input_layout = "tokens"

    def __init__(self, d_model=32, heads=4, layers=2, tokens=8, token_size=8, num_classes=NUM_CLASSES):
        super().__init__()
        self.embed = _dense(token_size, d_model)
        self.position = Parameter(initializer(Normal(0.02), (1, tokens, d_model)), name="position")
        self.encoder = nn.SequentialCell([
            nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(layers)])
        self.norm = nn.LayerNorm((d_model,))
        self.head = _dense(d_model, num_classes)

    def construct(self, x):
        x = self.embed(x) + ops.cast(self.position, x.dtype)
        x = self.norm(self.encoder(x))
        return self.head(x.mean(axis=1))


MODELS = {
    "mlp": MLP,
    "lenet5": LeNet5,
    "resnet": SmallResNet,
    "transformer": TinyTransformer,
}


def create_model(name, **kwargs):
    """Build a reference network by name (one of :data:`MODELS`).

    Example:
        >>> type(create_model("lenet5")).__name__
        'LeNet5'
    """
    if name not in MODELS:
        raise ValueError(f"'model' must be one of {sorted(MODELS)}, but got {name!r}.")
    return MODELS[name](**kwargs)

