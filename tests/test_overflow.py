"""Overflow detection: backend selection (pure) and what each branch builds on CPU."""
import numpy as np
import pytest
from mindspore import ParameterTuple, Tensor, mutable, nn, ops
from mindspore.common import dtype as mstype

from lossscale import TrainOneStepWithLossScaleCell, choose_overflow_check
from lossscale.overflow import nonfinite_indicator
from nets import regression_net

SELECTION = [
    # device target, MS_ASCEND_CHECK_OVERFLOW_MODE, SoC saturation-only (910A), expected check
    ("CPU", None, False, "isfinite"),
    ("CPU", "SATURATION_MODE", False, "isfinite"),
    ("GPU", None, False, "float_status"),
    ("Ascend", None, True, "ascend_saturation"),
    ("Ascend", "INFNAN_MODE", True, "ascend_saturation"),
    ("Ascend", "SATURATION_MODE", False, "ascend_saturation"),
    ("Ascend", "INFNAN_MODE", False, "ascend_allfinite"),
    ("Ascend", None, False, "ascend_allfinite"),
]


@pytest.mark.parametrize("device_target, mode, saturation_only, expected", SELECTION)
def test_choose_overflow_check(device_target, mode, saturation_only, expected):
    assert choose_overflow_check(device_target, mode, saturation_only) == expected


@pytest.mark.parametrize("args, pattern", [
    (("TPU",), "'device_target'.*'TPU'"),
    (("Ascend", "FAST_MODE"), "'ascend_mode'.*'FAST_MODE'"),
])
def test_choose_overflow_check_rejects_unknown_values(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        choose_overflow_check(*args)


def test_default_check_on_this_cpu_machine():
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(4.0))
    assert step.overflow_check == "isfinite"


class _Indicator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.hyper_map = ops.HyperMap()

    def construct(self, grads):
        return nonfinite_indicator(self.hyper_map, grads)


@pytest.fixture(scope="module")
def indicator():
    return _Indicator()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan, "inf-inf"])
def test_indicator_is_exact(indicator, dtype, bad):
    largest = np.finfo(dtype).max
    grads = [np.full((64, 33), largest, dtype), np.full((7,), -largest, dtype), np.zeros((2, 3, 4), dtype)]
    if bad == "inf-inf":  # opposite infinities in two tensors must not cancel out
        grads[0][5, 5], grads[2][1, 1, 1] = np.inf, -np.inf
    elif bad is not None:
        grads[1][3] = bad
    # mutable: the tuple is a runtime input, so the CPU kernels run (a constant tuple would be folded
    # at compile time).
    value = float(indicator(mutable(tuple(Tensor(g) for g in grads))).asnumpy())
    # Huge finite values never give a false overflow (a plain sum in the gradient's dtype would reach inf).
    assert np.isfinite(value) == (bad is None)


# Above and below GEMV_PROBE_MIN_SIZE (65536): both probe branches.
PROBE_SHAPES = [(1024, 784), (3, 30000), (70000, 1), (1 << 16,), (7,), (6, 1, 5, 5), (1000, 3), (1, 1), ()]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", PROBE_SHAPES)
def test_indicator_finds_every_position(indicator, dtype, shape):
    """inf, -inf and nan at the first, last, middle and a random position, among the largest finite values."""
    rng = np.random.RandomState(len(shape))
    size = int(np.prod(shape))
    values = (np.finfo(dtype).max * np.sign(rng.randn(size) + 0.1)).astype(dtype)
    other = np.ones((3, 2), dtype)
    assert np.isfinite(float(indicator(mutable((Tensor(values.reshape(shape)), Tensor(other)))).asnumpy()))
    for bad in (np.inf, -np.inf, np.nan):
        for position in sorted({0, size - 1, size // 2, int(rng.randint(size))}):
            broken = values.copy()
            broken[position] = bad
            value = indicator(mutable((Tensor(other), Tensor(broken.reshape(shape))))).asnumpy()
            assert not np.isfinite(float(value)), (bad, position)


@pytest.mark.parametrize("check, op", [
    ("float_status", "FloatStatus"),
    ("ascend_saturation", "NPUClearFloatStatusV2"),
    ("ascend_allfinite", "AllFinite"),
])
def test_gpu_and_ascend_branches_build_their_backend_op(check, op):
    """The branch compiles through type inference; CPU kernel selection then rejects exactly its op."""
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(4.0, mstype.float32),
                                         overflow_check=check)
    with pytest.raises(RuntimeError, match=rf"Unsupported op \[{op}\] on CPU"):
        step(Tensor(np.ones((4, 6), np.float32)), Tensor(np.ones((4, 3), np.float32)))


class _SparseGradientIndicator(nn.Cell):
    """The indicator over the real gradients of a network whose embedding gradient is a RowTensor."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingLookup(20, 4, target="CPU", sparse=True)
        self.dense = nn.Dense(4, 1)
        self.hyper_map = ops.HyperMap()
        self.grad = ops.GradOperation(get_by_list=True)
        self.weights = ParameterTuple(self.trainable_params())

    def loss(self, ids, offset):
        return (self.dense(self.embedding(ids)) + offset).mean()

    def construct(self, ids, offset):
        grads = self.grad(self.loss, self.weights)(ids, offset)
        return nonfinite_indicator(self.hyper_map, grads)


def test_indicator_accepts_sparse_gradients():
    """RowTensor gradients reach the check (a tuple primitive such as AddN or Concat fails to infer on them)."""
    indicator = _SparseGradientIndicator()
    ids = Tensor(np.array([[1, 2], [3, 4]], np.int32))
    assert float(indicator(ids, Tensor(np.float32(0.5))).asnumpy()) == 0.0
    indicator.dense.weight.set_data(Tensor(np.full((1, 4), np.inf, np.float32)))  # inf in the embedding gradient
    assert not np.isfinite(float(indicator(ids, Tensor(np.float32(0.5))).asnumpy()))
