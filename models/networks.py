"""Reference networks for the demo, the benchmarks and the tests.

Every network is built by a one-line constructor, takes a float32 batch in the
layout named by its ``input_layout`` attribute (see :func:`lossscale_models.data.to_layout`)
and returns logits. They contain only standard MindSpore cells, so
``mindspore.amp.auto_mixed_precision`` (``amp_level`` O0/O1/O2/O3) applies to them.

Example:
    >>> net = create_model("mlp")
    >>> net.input_layout, sum(p.size for p in net.trainable_params())
    ('flat', 85002)
"""

import math

from mindspore import Parameter, nn, ops
from mindspore.common.initializer import HeUniform, Normal, initializer

# Absolute, not ``from .data``: amp_level O1 (MindSpore's rewrite) imports this file again as the top-level
# module ``networks``, from its folder, where a relative import fails.
from lossscale_models.data import NUM_CLASSES


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
        self.stem = nn.SequentialCell([nn.Conv2d(1, channels, 3, pad_mode="same"), nn.BatchNorm2d(channels), nn.ReLU()])
        self.blocks = nn.SequentialCell([_ResidualBlock(channels) for _ in range(blocks)])
        self.head = _dense(channels, num_classes)

    def construct(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(axis=(2, 3)))


class _SelfAttention(nn.Cell):
    """Multi-head self-attention whose arithmetic stays in the input's dtype.

    Written out rather than ``nn.TransformerEncoderLayer``: before MindSpore 2.9 a float16 tensor
    divided by MindSpore's float32 0-d scaling tensor became float32, which its attention then refused
    in O2/O3. Here the 1/sqrt(head size) factor is cast to the scores' dtype.
    """

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads, self.head_size = heads, d_model // heads
        self.qkv = _dense(d_model, 3 * d_model)
        self.out = _dense(d_model, d_model)
        self.scale = 1.0 / math.sqrt(self.head_size)

    def construct(self, x):
        batch, tokens, d_model = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, self.head_size).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * ops.cast(self.scale, q.dtype)
        weights = ops.softmax(scores, axis=-1)
        mixed = ops.matmul(weights, v).transpose(0, 2, 1, 3).reshape(batch, tokens, d_model)
        return self.out(mixed)


class _EncoderLayer(nn.Cell):
    """Pre-norm Transformer encoder layer: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm((d_model,)), nn.LayerNorm((d_model,))
        self.attention = _SelfAttention(d_model, heads)
        self.mlp = nn.SequentialCell([_dense(d_model, 2 * d_model), nn.ReLU(), _dense(2 * d_model, d_model)])

    def construct(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Cell):
    """A tiny Transformer encoder classifier: the 8 image rows are 8 tokens of 8 pixels.

    Linear embedding + learned positions, ``layers`` pre-norm encoder layers, mean pooling over
    tokens, Dense head.

    Example:
        >>> TinyTransformer(d_model=16, heads=2, layers=1).input_layout
        'tokens'
    """

    input_layout = "tokens"

    def __init__(self, d_model=32, heads=4, layers=2, tokens=8, token_size=8, num_classes=NUM_CLASSES):
        super().__init__()
        self.embed = _dense(token_size, d_model)
        self.position = Parameter(initializer(Normal(0.02), (1, tokens, d_model)), name="position")
        self.encoder = nn.SequentialCell([_EncoderLayer(d_model, heads) for _ in range(layers)])
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
