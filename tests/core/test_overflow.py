"""Overflow detection: backend selection (pure), the exact CPU check, and each backend's check object
driven by CPU stand-ins of its primitive (tests/backend_standins.py)."""

import mindspore as ms
import numpy as np
import pytest
from backend_standins import AllFiniteStandIn, FloatStatusStandIn, SaturatingNet, StatusRegister, status_input
from mindspore import ParameterTuple, Tensor, mutable, nn, ops
from mindspore.common import dtype as mstype
from nets import changed_since, regression_batches, regression_net, tiered, training_state

from lossscale import (
    DynamicLossScaleManager,
    LossScaler,
    TrainOneStepWithLossScaleCell,
    choose_overflow_check,
    get_preset,
)
from lossscale.core.clipping import global_norm
from lossscale.core.compat import ascend_saturation_only
from lossscale.core.gradients import fingerprint, nonfinite_indicator, probe_plan
from lossscale.core.overflow import (
    AllFiniteCheck,
    AscendSaturationCheck,
    FloatStatusCheck,
    IsFiniteCheck,
    current_overflow_check,
    initial_status,
    make_overflow_check,
)
from lossscale.core.policy import run
from lossscale.core.scaler import scale_tensor

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


@pytest.mark.parametrize(
    "args, pattern",
    [
        (("TPU",), "'device_target'.*'TPU'"),
        (("Ascend", "FAST_MODE"), "'ascend_mode'.*'FAST_MODE'"),
    ],
)
def test_choose_overflow_check_rejects_unknown_values(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        choose_overflow_check(*args)


def test_default_check_on_this_cpu_machine():
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(4.0))
    assert step.overflow_check == "isfinite"


class _OverGradients(nn.Cell):
    """A graph helper of lossscale.core.overflow, ``helper(hyper_map, grads)``, compiled."""

    def __init__(self, helper):
        super().__init__()
        self.helper = helper
        self.hyper_map = ops.HyperMap()

    def construct(self, grads):
        return self.helper(self.hyper_map, grads)


@pytest.fixture(scope="module")
def indicator():
    return _OverGradients(nonfinite_indicator)


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


@pytest.mark.parametrize(
    "dtype", tiered({"float16": np.float16, "float32": np.float32, "float64": np.float64}, {"float16", "float32"})
)
# The README's tier: each probe branch (GEMV or not) with a matrix, a vector and a scalar; the slow tier every shape.
@pytest.mark.parametrize(
    "shape",
    tiered(
        {"x".join(map(str, shape)) or "scalar": shape for shape in PROBE_SHAPES},
        {"1024x784", "65536", "7", "6x1x5x5", "scalar"},
    ),
)
def test_indicator_finds_every_position(indicator, dtype, shape):
    """inf, -inf and nan at the first, last, middle and a random position, among the largest finite values."""
    rng = np.random.RandomState(len(shape))
    size = int(np.prod(shape))
    values = (np.finfo(dtype).max * np.sign(rng.randn(size) + 0.1)).astype(dtype)
    other = np.ones((3, 2), dtype)
    assert np.isfinite(float(indicator(mutable((Tensor(other), Tensor(values.reshape(shape))))).asnumpy()))
    for bad in (np.inf, -np.inf, np.nan):
        for position in sorted({0, size - 1, size // 2, int(rng.randint(size))}):
            broken = values.copy()
            broken[position] = bad
            value = indicator(mutable((Tensor(other), Tensor(broken.reshape(shape))))).asnumpy()
            assert not np.isfinite(float(value)), (bad, position)


@pytest.mark.parametrize("constant", [True, False], ids=["constant", "mutable"])
@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_indicator_takes_bfloat16_gradients(indicator, constant, bad):
    """bfloat16 gradients, eagerly (constants: the isfinite probe, which had no bfloat16 CPU kernel and raised
    "Select CPU operator[IsFinite] fail") and as runtime inputs, small and above the GEMV size."""
    arrays = [np.ones((300, 300), np.float32), np.full((5,), 3.0e38, np.float32)]
    if bad is not None:
        arrays[0][3, 4] = bad
    grads = tuple(Tensor(a).astype(mstype.bfloat16) for a in arrays)
    value = nonfinite_indicator(ops.HyperMap(), grads) if constant else indicator(mutable(grads))
    assert np.isfinite(float(value.asnumpy())) == (bad is None)


@pytest.fixture(scope="module")
def fingerprint_of():
    cell = _OverGradients(fingerprint)
    return lambda *arrays: float(cell(mutable(tuple(Tensor(a) for a in arrays))).asnumpy())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1024, 784), pytest.param((6, 1, 5, 5), marks=pytest.mark.slow), (7,)])
def test_fingerprint_tells_scaled_from_unscaled_and_is_finite_exactly_when_the_values_are(fingerprint_of, dtype, shape):
    """What GradScaler.step() relies on to refuse the scaled gradients unscale_() was given. A float64 gradient
    gave 0 (so the refusal never fired and S-times gradients were applied), and its sum beyond float32's range
    would have been inf."""
    rng = np.random.RandomState(len(shape))
    values = rng.randn(*shape).astype(dtype)
    other = np.ones((3, 2), dtype)
    plain = fingerprint_of(values, other)
    assert np.isfinite(plain) and plain != 0.0 and fingerprint_of(values, other) == plain
    assert fingerprint_of((values * 1024).astype(dtype), other * 1024) != plain
    largest = (np.finfo(dtype).max * np.sign(values + 0.1)).astype(dtype)  # huge finite sums stay finite
    assert np.isfinite(fingerprint_of(largest, np.full((3, 2), np.finfo(dtype).max, dtype)))
    for bad in (np.inf, -np.inf, np.nan):
        broken = values.copy()
        broken.reshape(-1)[values.size // 2] = bad
        assert not np.isfinite(fingerprint_of(other, broken)), bad


# Gradients reduced together in float32 buffers (below GEMV_PROBE_MIN_SIZE, at most FLAT_GROUP_SIZE values per
# buffer) and alone (large, float64, empty): each helper gives what it gives per gradient.
GROUPED_CASES = {
    "mixed": [
        ((7,), np.float32),
        ((300, 300), np.float32),
        ((3, 5), np.float16),
        ((0,), np.float32),
        ((4,), np.float64),
        ((2, 2), np.float32),
    ],
    "three_buffers": [((60000,), np.float32)] * 36,
}


@pytest.mark.parametrize("case", tiered(list(GROUPED_CASES), {"mixed"}))
def test_gradients_in_buffers_give_the_helpers_values(case):
    rng = np.random.RandomState(0)
    arrays = [(rng.randn(*shape) * 3).astype(dtype) for shape, dtype in GROUPED_CASES[case]]
    alone, groups = probe_plan(tuple(a.size if a.dtype != np.float64 and 0 < a.size < 65536 else 0 for a in arrays))
    assert len(groups) == (1 if case == "mixed" else 3) and sorted(alone + sum(groups, ())) == list(range(len(arrays)))
    norm = _OverGradients(global_norm)
    expected = np.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays))
    assert float(norm(mutable(tuple(Tensor(a) for a in arrays))).asnumpy()) == pytest.approx(expected, rel=1e-5)
    indicator, weighted = _OverGradients(nonfinite_indicator), _OverGradients(fingerprint)
    assert float(indicator(mutable(tuple(Tensor(a) for a in arrays))).asnumpy()) == 0.0
    assert np.isfinite(float(weighted(mutable(tuple(Tensor(a) for a in arrays))).asnumpy()))
    filled = [index for index, array in enumerate(arrays) if array.size]
    for index in sorted({filled[0], filled[len(filled) // 2], filled[-1]}):
        broken = [a.copy() for a in arrays]
        broken[index].reshape(-1)[-1] = np.nan
        grads = mutable(tuple(Tensor(a) for a in broken))
        assert np.isnan(float(indicator(grads).asnumpy())) and np.isnan(float(weighted(grads).asnumpy())), index


_CORE = LossScaler(get_preset("pytorch", init_scale=8.0), name="constant_gradients")


def _indicator_in_graph(grads):
    return nonfinite_indicator(ops.HyperMap(), grads)


def _fingerprint_in_graph(grads):
    return fingerprint(ops.HyperMap(), grads)


def _core_flag_in_graph(grads):
    return _CORE.flag(None, grads)


@pytest.mark.parametrize(
    "of_gradients",
    [_indicator_in_graph, _fingerprint_in_graph, _core_flag_in_graph],
    ids=["indicator", "fingerprint", "LossScaler.flag"],
)
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_gradients_given_to_a_compiled_function_keep_their_nan_and_inf(of_gradients, bad):
    """Gradients passed into a mindspore.jit function (without mutable) are constants of its graph, and MindSpore
    2.10 folds reduce_sum(g * 0) of [[nan, 1.0]] to 0: without the isfinite probe for constants, the core's check
    in a custom loop's compiled function took such gradients for finite ones (measured)."""

    @ms.jit
    def compiled(grads):
        return of_gradients(grads)

    grads = (Tensor(np.array([[1.0 if bad is None else bad, 1.0]], np.float32)), Tensor(np.ones(3, np.float32)))
    assert np.isfinite(float(compiled(grads).asnumpy())) == (bad is None)


def test_a_float64_fingerprint_grows_with_the_sum_over_float64s_whole_range(fingerprint_of):
    """A float64 gradient's sum, times 2**-64, is compressed into float32's range (itself within [-1, 1], else
    sign * (1 + log|sum|)): finite, and strictly increasing in the sum, so S-times gradients never share the
    unscaled gradients' fingerprint, nor do negated ones (the sign) or those just beyond 1 (the 1 +)."""
    weighted_sums = [-1e280, -1e10, -3.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0, 1e10, 1e280]
    prints = [fingerprint_of(np.array([value * 2.0**64], np.float64)) for value in weighted_sums]
    assert all(np.isfinite(prints)) and all(low < high for low, high in zip(prints, prints[1:])), prints
    assert fingerprint_of(np.array([1e280 * 2.0**64 / 1024], np.float64)) < prints[-1]


@pytest.mark.parametrize(
    "check, op",
    [
        ("float_status", "FloatStatus"),
        ("ascend_saturation", "NPUClearFloatStatusV2"),
        ("ascend_allfinite", "AllFinite"),
    ],
)
def test_gpu_and_ascend_branches_build_their_backend_op(check, op):
    """The branch compiles through type inference; CPU kernel selection then rejects exactly its op."""
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(4.0, mstype.float32), overflow_check=check
    )
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


class _SparseGradientUnscaled(_SparseGradientIndicator):
    """The embedding's RowTensor gradient and the dense weight's, as computed and as LossScaler.unscale gives them."""

    def __init__(self, core):
        super().__init__()
        self.core = core

    def construct(self, ids, offset):
        grads = self.grad(self.loss, self.weights)(ids, offset)
        unscaled = self.core.unscale(grads)
        return grads[0].values, grads[0].indices, grads[1], unscaled[0].values, unscaled[0].indices, unscaled[1]


def test_unscaling_divides_a_sparse_gradients_values_and_keeps_its_indices():
    """A RowTensor gradient is unscaled through its values (returning it as it came passed the suite)."""
    cell = _SparseGradientUnscaled(LossScaler(8.0, name="sparse_unscale"))
    values, indices, weight, unscaled_values, unscaled_indices, unscaled_weight = (
        out.asnumpy() for out in cell(Tensor(np.array([[1, 2], [3, 4]], np.int32)), Tensor(np.float32(0.5)))
    )
    assert np.abs(values).min() > 0 and unscaled_values.tolist() == (values / 8).tolist()
    assert unscaled_indices.tolist() == indices.tolist() == [1, 2, 3, 4]
    assert unscaled_weight.tolist() == (weight / 8).tolist()


# ---- SoC detection on every supported MindSpore ------------------------------------------------------------


class _Context210:
    """MindSpore >= 2.10: ascend_soc_supports_feature."""

    def __init__(self, classic):
        self.classic = classic

    def ascend_soc_supports_feature(self, feature):
        return self.classic and feature == "amp_loss_scale_train_classic_target"


class _ContextBefore210:
    """MindSpore < 2.10: only the SoC version."""

    def __init__(self, version):
        self.version = version

    def get_ascend_soc_version(self):
        return self.version


@pytest.mark.parametrize(
    "context, expected",
    [
        (_Context210(True), True),
        (_Context210(False), False),
        (_ContextBefore210("ascend910"), True),
        (_ContextBefore210("ascend910b"), False),
        (_ContextBefore210("ascend910_93"), False),
    ],
)
def test_ascend_saturation_only_on_every_mindspore(context, expected):
    assert ascend_saturation_only(context) is expected


class _NoSoCHere:
    """A context that must not be asked: off Ascend there is no SoC to report."""

    def ascend_soc_supports_feature(self, feature):
        raise AssertionError(f"the Ascend SoC was asked ({feature}) on another device")

    def get_ascend_soc_version(self):
        raise AssertionError("the Ascend SoC version was asked on another device")


@pytest.mark.parametrize(
    "device_target, mode, context, expected",
    [
        ("CPU", None, _NoSoCHere(), "isfinite"),
        ("CPU", "SATURATION_MODE", _NoSoCHere(), "isfinite"),
        ("GPU", "", _NoSoCHere(), "float_status"),
        ("Ascend", None, _Context210(True), "ascend_saturation"),
        ("Ascend", "", _ContextBefore210("ascend910"), "ascend_saturation"),
        ("Ascend", "", _Context210(False), "ascend_allfinite"),
        ("Ascend", "SATURATION_MODE", _ContextBefore210("ascend910b"), "ascend_saturation"),
        ("Ascend", "INFNAN_MODE", _Context210(False), "ascend_allfinite"),
    ],
)
def test_current_overflow_check_reads_the_device_the_environment_and_the_soc(
    monkeypatch, device_target, mode, context, expected
):
    """The default of every train cell and front-end, with the device target and the SoC stood in for: the SoC is
    asked on Ascend only, and an empty MS_ASCEND_CHECK_OVERFLOW_MODE counts as unset (MindSpore takes any value
    but SATURATION_MODE as INFNAN mode)."""
    real_get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: device_target if key == "device_target" else real_get_context(key)
    )
    if mode is None:
        monkeypatch.delenv("MS_ASCEND_CHECK_OVERFLOW_MODE", raising=False)
    else:
        monkeypatch.setenv("MS_ASCEND_CHECK_OVERFLOW_MODE", mode)
    assert current_overflow_check(context) == expected


@pytest.mark.parametrize(
    "value, error, pattern",
    [
        ("tpu_status", ValueError, "'overflow_check'.*'tpu_status'"),
        (42, TypeError, "'overflow_check'.*int"),
        (nn.ReLU(), TypeError, r"start\(\) and flag\(\)"),
    ],
)
def test_make_overflow_check_rejects(value, error, pattern):
    with pytest.raises(error, match=pattern):
        make_overflow_check(value)


# ---- each check object with a stand-in primitive ------------------------------------------------------------


class _Flag(nn.Cell):
    """``check.flag(status, grads)`` compiled, for one check object."""

    def __init__(self, check):
        super().__init__()
        self.check = check

    def construct(self, grads):
        return self.check.flag(status_input(), grads)


@pytest.fixture(scope="module")
def flag_cells():
    return {
        "isfinite": _Flag(IsFiniteCheck()),
        "float_status": _Flag(FloatStatusCheck(FloatStatusStandIn())),
        "ascend_allfinite": _Flag(AllFiniteCheck(AllFiniteStandIn())),
    }


# per check: the flag for (clean, one bad tensor, two bad tensors); nan means "non-finite"
FLAG_TABLE = {"isfinite": (0.0, np.nan, np.nan), "float_status": (0.0, 1.0, 2.0), "ascend_allfinite": (0.0, 1.0, 1.0)}


@pytest.mark.parametrize("name", sorted(FLAG_TABLE))
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_check_flag_values_and_polarity(flag_cells, name, bad):
    clean = (np.ones((4, 3), np.float32), np.full((5,), 3e38, np.float32))
    one_bad = (clean[0].copy(), clean[1])
    one_bad[0][2, 1] = bad
    two_bad = (one_bad[0], clean[1].copy())
    two_bad[1][4] = bad
    got = [
        float(flag_cells[name](mutable(tuple(Tensor(g) for g in grads))).asnumpy())
        for grads in (clean, one_bad, two_bad)
    ]
    np.testing.assert_array_equal(got, FLAG_TABLE[name])


def _standin_check(name, register=None):
    if name == "float_status":
        return FloatStatusCheck(FloatStatusStandIn())
    if name == "ascend_allfinite":
        return AllFiniteCheck(AllFiniteStandIn())
    return AscendSaturationCheck(register.clear_status, register.get_status)


@pytest.mark.parametrize("name", ["float_status", "ascend_allfinite"])
def test_train_cell_with_standin_check_skips_and_follows_the_policy(name):
    """The GPU and Ascend INFNAN logic in the train cell: skip exactly on inf/nan, scale as the policy."""
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.05), manager.get_update_cell(), overflow_check=_standin_check(name)
    )
    flags = [False, True, False, False, True, False]
    for flag, (x, y) in zip(flags, regression_batches(len(flags))):
        if flag:
            x = x.copy()
            x[1, 2] = np.nan
        before = training_state(step)
        assert bool(step(Tensor(x), Tensor(y))[1].asnumpy()) == flag
        unchanged = changed_since(before, step) == []
        assert unchanged == flag
    assert step.get_loss_scale() == run(manager.policy, flags)[-1].scale


@pytest.fixture(scope="module")
def saturation_cells():
    """Train cells on SaturatingNet: the Ascend saturation check with a stand-in register, and isfinite."""
    register = StatusRegister()
    cells = {}
    for forward in (False, True):
        net = SaturatingNet(register, forward=forward)
        cells[forward] = TrainOneStepWithLossScaleCell(
            net,
            nn.SGD(net.trainable_params(), 0.1),
            DynamicLossScaleManager(2**10, 2, 100).get_update_cell(),
            overflow_check=AscendSaturationCheck(register.clear_status, register.get_status),
        )
    net = SaturatingNet(register)
    isfinite = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(2.0**10))
    return register, cells, isfinite


@pytest.mark.parametrize("forward_saturates", [False, True])
def test_ascend_saturation_check_reads_the_backward_and_only_the_backward(saturation_cells, forward_saturates):
    register, cells, _ = saturation_cells
    step = cells[forward_saturates]
    # x = 200 makes the backward saturate at scale 1024 (1024 * 200 / 3 > 65504); x = 1 does not. With
    # forward_saturates the forward pass sets the register on every step: cleared before backward, not counted.
    expected = [(1.0, False, 1024.0), (200.0, True, 512.0), (1.0, False, 512.0), (1.0, False, 512.0)]
    order = ["forward", "forward", "clear", "backward", "get", "clear"][0 if forward_saturates else 1 :]
    for x, overflow, scale in expected:
        register.log.clear()
        w = step.network.w.asnumpy().copy()
        result = step(Tensor(np.array([1.0, 2.0, x], np.float32)))
        assert (bool(result[1].asnumpy()), float(result[2].asnumpy())) == (overflow, scale)
        assert np.array_equal(step.network.w.asnumpy(), w) == overflow
        assert register.log == order  # cleared after the loss, read after the gradients, cleared again
        assert not register.bits.any()  # the next step starts clean


def test_with_clipping_the_saturation_register_still_decides():
    """With clip_global_norm a non-finite global norm decides for the checks of inf/nan, but saturated gradients
    are finite: in saturation mode the register must still be read, or the norm alone would apply the step."""
    register = StatusRegister()
    net = SaturatingNet(register)
    step = TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.1),
        Tensor(np.float32(2.0**10)),
        clip_global_norm=1.0,
        overflow_check=AscendSaturationCheck(register.clear_status, register.get_status),
    )
    for x, overflow in [(200.0, True), (1.0, False)]:  # x = 200 saturates the backward at scale 1024
        w = step.network.w.asnumpy().copy()
        assert bool(step(Tensor(np.array([1.0, 2.0, x], np.float32)))[1].asnumpy()) == overflow
        assert np.array_equal(step.network.w.asnumpy(), w) == overflow


def test_saturated_gradients_are_finite_so_isfinite_would_miss_them(saturation_cells):
    """Why saturation mode needs the register: the same saturating backward gives finite gradients."""
    _, _, isfinite = saturation_cells
    assert not bool(isfinite(Tensor(np.array([1.0, 2.0, 200.0], np.float32)))[1].asnumpy())


class _StatusSum(nn.Cell):
    """A check whose flag is the sum of the status it is given, so what LossScaler.flag passes on shows."""

    name = "status_sum"

    @staticmethod
    def before_backward(loss):
        return loss

    def start(self, pre_cond, compute_input):
        return initial_status(), compute_input

    def flag(self, status, grads):
        return ops.cast(status.sum(), mstype.float32)


def test_core_flag_passes_the_given_status_on_and_makes_one_where_none_is_given():
    """The status from the check's start() reaches its flag() (an Ascend register read); None gets the check a
    fresh one (the front-ends have no start())."""
    core = LossScaler(8.0, name="status_passing", overflow_check=_StatusSum())
    grads = (Tensor(np.ones(2, np.float32)),)
    assert float(core.flag(None, grads).asnumpy()) == 0.0
    assert float(core.flag(Tensor(np.arange(8), mstype.int32), grads).asnumpy()) == 28.0


def test_core_graph_methods_use_a_given_scale_else_their_own():
    """sens, unscale and scale take the scale the caller has (the train cell's, ordered after the check's start)
    or read their own Parameter; sens is in the loss's dtype and shape."""
    core = LossScaler(8.0, name="explicit_scale")
    given = Tensor(np.float32(4.0))
    loss = Tensor(np.array([1.0, 2.0], np.float16))
    for scale, expected in ((None, 8.0), (given, 4.0)):
        sens = core.sens(loss, scale)
        assert sens.dtype == mstype.float16 and sens.asnumpy().tolist() == [expected] * 2
        (grad,) = core.unscale((Tensor(np.array([8.0, 16.0], np.float16)),), scale)
        assert grad.dtype == mstype.float16 and grad.asnumpy().tolist() == [8.0 / expected, 16.0 / expected]
        with pytest.warns(UserWarning, match="outside a function being differentiated: the scaled loss carries no"):
            scaled = core.scale(loss, scale)
        assert scaled.dtype == mstype.float32 and scaled.asnumpy().tolist() == [expected, 2 * expected]


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "parameter"])
@pytest.mark.slow
def test_core_get_scale_inside_a_compiled_function(frozen):
    """A frozen scale is a Python float even while tracing (a constant of the graph, nothing read); a Parameter is
    read when the graph runs, so a later set_scale reaches the compiled function."""
    core = LossScaler(8.0, name=None if frozen else "get_scale_traced", frozen=frozen)

    @ms.jit
    def traced(x):
        return isinstance(core.get_scale(), float), x * core.get_scale(), scale_tensor(core) * x

    eager = scale_tensor(core)
    assert isinstance(eager, Tensor) and eager.dtype == mstype.float32 and float(eager.asnumpy()) == 8.0
    is_float, product, tensor_product = traced(Tensor(np.float32(2.0)))
    assert bool(is_float) is frozen
    assert float(product.asnumpy()) == float(tensor_product.asnumpy()) == 16.0
    if not frozen:
        core.set_scale(4.0)
        assert [float(value.asnumpy()) for value in traced(Tensor(np.float32(2.0)))[1:]] == [8.0, 8.0]
