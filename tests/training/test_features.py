"""Training-loop features of the train cell: clipping, accumulation, resume, overflow policy,
counters, forensics, bad input, and property-based invariants."""

import inspect
import json
import logging
import os
import subprocess
import sys
import warnings

import mindspore as ms
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from nets import (
    TESTS,
    GradCapture,
    LossPlusInput,
    changed_since,
    jit_if,
    regression_batches,
    regression_net,
    snapshot,
    tiered,
    train_calls,
    training_state,
)

from lossscale import (
    AdaptiveLossScaleManager,
    DynamicLossScaleManager,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    Model,
    TrainOneStepWithLossScaleCell,
    build_train_network,
    restore_loss_scale,
)
from lossscale.core.clipping import global_norm
from lossscale.core.policy import run
from lossscale.training.bookkeeping import INT32_MAX, PersistentOverflowError

HERE = TESTS


def _poisoned(batch, value=np.inf):
    x, y = batch
    x = x.copy()
    x[0, 0] = value
    return x, y


def _tensors(batch):
    return tuple(Tensor(a) for a in batch)


def _dynamic(**kwargs):
    return DynamicLossScaleManager(**dict(dict(init_loss_scale=2**10, scale_window=1000), **kwargs))


# ---- 1. clipping ---------------------------------------------------------------------------------


def _captured(step, optimizer, batch):
    step(*_tensors(batch))
    return [g.asnumpy().copy() for g in optimizer.captured]


def test_clipping_applies_to_the_unscaled_gradients():
    batch = regression_batches(1)[0]
    net = regression_net()
    plain_opt = GradCapture(net.trainable_params())
    true_grads = _captured(TrainOneStepWithLossScaleCell(net, plain_opt, Tensor(1.0)), plain_opt, batch)
    true_norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in true_grads))
    clip = true_norm / 4
    net = regression_net()
    opt = GradCapture(net.trainable_params())
    step = TrainOneStepWithLossScaleCell(
        net, opt, _dynamic(init_loss_scale=2**14).get_update_cell(), clip_global_norm=clip
    )
    clipped = _captured(step, opt, batch)
    clipped_norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in clipped))
    assert clipped_norm == pytest.approx(clip, rel=1e-5)
    for got, true in zip(clipped, true_grads):
        np.testing.assert_allclose(got, true * (clip / true_norm), rtol=1e-5, atol=1e-9)


@pytest.mark.slow
def test_clipping_leaves_small_gradients_alone_and_matches_mindspore_clip():
    batch = regression_batches(1)[0]
    net = regression_net()
    opt = GradCapture(net.trainable_params())
    got = _captured(TrainOneStepWithLossScaleCell(net, opt, Tensor(64.0), clip_global_norm=1e6), opt, batch)
    net = regression_net()
    reference_opt = GradCapture(net.trainable_params())
    reference = _captured(TrainOneStepWithLossScaleCell(net, reference_opt, Tensor(64.0)), reference_opt, batch)
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a, b)
    expected = ops.clip_by_global_norm(tuple(Tensor(g) for g in reference), 0.1)
    net = regression_net()
    opt = GradCapture(net.trainable_params())
    small = _captured(TrainOneStepWithLossScaleCell(net, opt, Tensor(64.0), clip_global_norm=0.1), opt, batch)
    for a, b in zip(small, expected):
        np.testing.assert_allclose(a, b.asnumpy(), rtol=1e-6)


def test_a_missing_gradient_adds_nothing_to_the_global_norm(compiled):
    """The functional front-ends pass None gradients through, and the GradScaler's check of what reaches step()
    after unscale_() compares global norms: a None entry must not count."""

    def norm(grad):
        return global_norm(ops.HyperMap(), (grad, None))

    norm = jit_if(compiled, norm)
    assert float(norm(Tensor(np.array([3.0, 4.0], np.float32))).asnumpy()) == 5.0


def test_non_finite_global_norm_is_an_overflow():
    net = regression_net()
    manager = _dynamic()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), manager.get_update_cell(), clip_global_norm=1.0
    )
    before = training_state(step)
    for value in (np.inf, np.nan):
        _, overflow, _ = step(*_tensors(_poisoned(regression_batches(1)[0], value)))
        assert bool(overflow.asnumpy())
    assert changed_since(before, step) == []
    assert manager.get_loss_scale() == 256.0


def test_clipping_through_build_train_network_and_model():
    net = regression_net()
    step = build_train_network(net, nn.SGD(net.trainable_params(), 0.1), clip_global_norm=0.5)
    assert isinstance(step, TrainOneStepWithLossScaleCell) and step.clip_global_norm == 0.5
    assert step.get_loss_scale() == 1.0 and not step.drop_overflow_update
    model_net = nn.Dense(6, 3)
    model = Model(
        model_net,
        nn.MSELoss(),
        nn.SGD(model_net.trainable_params(), 0.1),
        loss_scale_manager=_dynamic(),
        clip_global_norm=2.0,
        accumulation_steps=2,
    )
    assert model.train_network.clip_global_norm == 2.0 and model.train_network.accumulation_steps == 2


# The fixed-scale recipe, in which the optimizer divides by the scale (loss_scale=S): what reaches it is still
# scaled, so clipping and the reported norm must measure the unscaled values. Each builder takes the optimizer's
# loss_scale (S for the recipe, 1 for the control, in which the train cell unscales) and the step's options.
_RECIPE_SCALE = 1024.0


def _recipe_cell(scale_sense):
    def build(net, opt_scale, **options):
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=opt_scale)
        return TrainOneStepWithLossScaleCell(net, opt, scale_sense(), drop_overflow_update=False, **options)

    return build


def _recipe_build_train_network(net, opt_scale, **options):
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=opt_scale)
    return build_train_network(net, opt, loss_scale_manager=FixedLossScaleManager(_RECIPE_SCALE, False), **options)


def _recipe_model(net, opt_scale, **options):
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=opt_scale)
    return Model(
        net.backbone_network,
        nn.MSELoss(),
        opt,
        loss_scale_manager=FixedLossScaleManager(_RECIPE_SCALE, False),
        **options,
    ).train_network


_RECIPE_BUILDERS = {
    "FixedLossScaleUpdateCell": _recipe_cell(lambda: FixedLossScaleUpdateCell(_RECIPE_SCALE)),
    "Tensor": _recipe_cell(lambda: Tensor(_RECIPE_SCALE, mstype.float32)),
    "build_train_network": _recipe_build_train_network,
    "Model": _recipe_model,
}
# (options, factor of the inputs): with inputs 3e8 the unscaled global norm fits float32 and the scaled one does not.
_RECIPE_CASES = {
    "clipping": (dict(clip_global_norm=0.05, extra_outputs=True), 1.0),
    "clipping and accumulation": (dict(clip_global_norm=0.05, extra_outputs=True, accumulation_steps=2), 1.0),
    "reported norm": (dict(extra_outputs=True), 1.0),
    "clipping of a norm whose scaled square overflows": (dict(clip_global_norm=0.05, extra_outputs=True), 3e8),
}


@pytest.mark.parametrize("options, factor", _RECIPE_CASES.values(), ids=_RECIPE_CASES)
@pytest.mark.parametrize("build", _RECIPE_BUILDERS.values(), ids=_RECIPE_BUILDERS)
@pytest.mark.slow
def test_fixed_scale_recipe_clips_and_reports_the_unscaled_gradients(build, options, factor):
    """The optimizer built with loss_scale=S receives scaled gradients: they are clipped by the norm of their
    unscaled values and the reported norm is that norm, so the weights and outputs (overflow, scale, learning rate,
    norm) equal the control's, in which the train cell unscales (S a power of two: equal to the bit)."""
    runs = {}
    for opt_scale in (_RECIPE_SCALE, 1.0):
        net = regression_net()
        step = build(net, opt_scale, **options)
        assert step.optimizer_unscales == (opt_scale != 1.0)
        outputs = [
            [float(np.asarray(v.asnumpy()).reshape(-1)[0]) for v in step(Tensor(x * factor), Tensor(y))[1:]]
            for x, y in regression_batches(4)
        ]
        runs[opt_scale] = outputs, snapshot(net)
    (outputs, weights), (control_outputs, control_weights) = runs[_RECIPE_SCALE], runs[1.0]
    assert outputs == control_outputs
    assert not any(overflow for overflow, *_ in control_outputs)
    assert max(norm for *_, norm in control_outputs) > options.get("clip_global_norm", 0.0)  # clipping did clip
    for name, value in control_weights.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


# ---- 2. accumulation ------------------------------------------------------------------------------


def _big_batches(micro_batches, n):
    return [
        tuple(np.concatenate(parts) for parts in zip(*micro_batches[i : i + n]))
        for i in range(0, len(micro_batches), n)
    ]


@pytest.mark.parametrize(
    "optimizer_factory",
    [
        lambda net: nn.Momentum(net.trainable_params(), 0.05, 0.9),
        lambda net: nn.Adam(net.trainable_params(), 0.01),
    ],
    ids=["momentum", "adam"],
)
@pytest.mark.slow
def test_accumulation_equals_one_large_batch(optimizer_factory):
    micro = regression_batches(12, batch=4)
    control_net, accumulating_net = regression_net(), regression_net()
    control = nn.TrainOneStepCell(control_net, optimizer_factory(control_net))
    step = TrainOneStepWithLossScaleCell(
        accumulating_net,
        optimizer_factory(accumulating_net),
        _dynamic(init_loss_scale=2**12).get_update_cell(),
        accumulation_steps=4,
    )
    for window, big in enumerate(_big_batches(micro, 4)):
        control(*_tensors(big))
        outputs = [step(*_tensors(b)) for b in micro[4 * window : 4 * window + 4]]
        assert [bool(o[1].asnumpy()) for o in outputs] == [False] * 4
        for name, value in training_state(control).items():
            np.testing.assert_allclose(training_state(step)[name], value, rtol=2e-5, atol=1e-7, err_msg=name)
    assert step.overflow_counters()["steps"] == 3


def test_overflowing_micro_batch_skips_the_whole_window():
    micro = regression_batches(8, batch=4)
    manager = _dynamic(scale_window=100)
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), manager.get_update_cell(), accumulation_steps=4
    )
    before = training_state(step)
    outputs = [step(*_tensors(_poisoned(b) if i == 1 else b)) for i, b in enumerate(micro[:4])]
    assert [bool(o[1].asnumpy()) for o in outputs] == [False, False, False, True]
    assert [float(o[2].asnumpy()) for o in outputs] == [1024.0, 1024.0, 1024.0, 512.0]  # constant in a window
    assert changed_since(before, step) == []
    assert all(not a.asnumpy().any() for a in step.accumulators)  # discarded
    # The next window is unaffected: it equals a control step on its large batch.
    control_net = regression_net()
    control = nn.TrainOneStepCell(control_net, nn.SGD(control_net.trainable_params(), 0.1))
    control(*_tensors(_big_batches(micro[4:], 4)[0]))
    for b in micro[4:]:
        step(*_tensors(b))
    for name, value in training_state(control).items():
        np.testing.assert_allclose(training_state(step)[name], value, rtol=2e-5, atol=1e-7, err_msg=name)
    assert step.overflow_counters() == {
        "steps": 2,
        "skipped_steps": 1,
        "consecutive_overflows": 0,
        "last_overflow_step": 1,
    }


@pytest.mark.parametrize("micro_batch", [0, 1, 2])
def test_a_non_finite_loss_in_any_micro_batch_skips_the_whole_window(micro_batch):
    """A non-finite loss with finite gradients leaves nothing in the accumulators for the check of the window's mean
    to see: only the window's flag, carried from micro-batch to micro-batch, remembers it at the window's end."""
    net = LossPlusInput()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.5), _dynamic().get_update_cell(), accumulation_steps=3
    )
    y, offsets = Tensor(np.ones(3, np.float32)), [0.0, 0.0, 0.0]
    offsets[micro_batch] = np.inf
    before = training_state(step)
    assert [bool(step(y, Tensor(np.float32(o)))[1].asnumpy()) for o in offsets] == [False, False, True]
    assert changed_since(before, step) == [] and float(step.get_loss_scale()) == 512.0
    assert step.overflow_counters()["skipped_steps"] == 1
    assert [bool(step(y, Tensor(np.float32(0.0)))[1].asnumpy()) for _ in range(3)] == [False] * 3  # window reset
    assert changed_since(before, step) == ["global_step", "w"]


# ---- 3. resume in a fresh process -------------------------------------------------------------------


@pytest.mark.slow
def test_resume_in_a_fresh_process_matches_an_uninterrupted_run(tmp_path):
    worker = os.path.join(HERE, "resume_worker.py")
    for mode in ("full", "first", "resume"):
        done = subprocess.run(
            [sys.executable, worker, mode, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
    full, first, resumed = (json.loads((tmp_path / f"{m}.json").read_text()) for m in ("full", "first", "resume"))
    assert first["flags"] + resumed["flags"] == full["flags"]
    assert first["scales"] + resumed["scales"] == full["scales"]
    assert resumed["counters"] == full["counters"] and full["counters"]["skipped_steps"] >= 3
    expected, got = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resume.npz")
    assert sorted(expected.files) == sorted(got.files)
    for name in expected.files:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_all_loss_scale_state_is_in_named_parameters():
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), _dynamic(hysteresis=2).get_update_cell(), accumulation_steps=2
    )
    names = {p.name for p in step.get_parameters() if p.name == "scale_sense" or p.name.startswith("loss_scale_")}
    assert {
        "scale_sense",
        "loss_scale_good_steps",
        "loss_scale_hysteresis_left",
        "loss_scale_steps",
        "loss_scale_skipped_steps",
        "loss_scale_consecutive_overflows",
        "loss_scale_last_overflow_step",
        "loss_scale_micro_step",
        "loss_scale_window_overflow",
    } <= names


# ---- 4. persistent-overflow policy ------------------------------------------------------------------


def _policy_step(**kwargs):
    net = regression_net()
    manager = kwargs.pop("manager", _dynamic())
    return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), manager.get_update_cell(), **kwargs)


def test_raise_after_k_consecutive_overflows():
    step = _policy_step(overflow_policy="raise", max_consecutive_overflows=3)
    bad = _tensors(_poisoned(regression_batches(1)[0]))
    step(*bad)
    step(*_tensors(regression_batches(1)[0]))  # a clean step resets the run
    step(*bad)
    step(*bad)
    with pytest.raises(PersistentOverflowError, match=r"step 5: 3 consecutive overflowing steps.*loss scale 128"):
        step(*bad)


@pytest.mark.parametrize(
    "manager",
    [
        lambda: _dynamic(init_loss_scale=4.0, min_loss_scale=1.0),
        lambda: AdaptiveLossScaleManager(init_loss_scale=4.0),  # MindFormers' rule floors the scale at 1
    ],
    ids=["dynamic", "adaptive"],
)
def test_raise_when_an_overflow_hits_the_minimum_scale(manager):
    step = _policy_step(manager=manager(), overflow_policy="raise")
    bad = _tensors(_poisoned(regression_batches(1)[0]))
    for _ in range(2):
        step(*bad)  # 4 -> 2 -> 1
    assert step.get_loss_scale() == 1.0
    with pytest.raises(PersistentOverflowError, match="already at its minimum 1.*debug_overflow=True"):
        step(*bad)


@pytest.mark.parametrize(
    "options",
    tiered(
        {
            "raise": {"overflow_policy": "raise"},
            "warn": {"overflow_policy": "warn"},
            "forensics": {"debug_overflow": True},
            "skip": {},
        },
        {"raise", "skip"},
    ),
)
def test_host_side_checks_refuse_to_be_compiled_into_another_graph(options):
    """Called inside the user's own mindspore.jit, the cell's __call__ (where the policy and the forensics run)
    was bypassed: a persistent overflow at the minimum scale with overflow_policy='raise' never raised."""
    step = _policy_step(manager=_dynamic(init_loss_scale=1.0, min_loss_scale=1.0), **options)
    bad = _tensors(_poisoned(regression_batches(1)[0]))

    @ms.jit
    def outer(x, y):
        return step(x, y)

    if not options:
        assert bool(outer(*bad)[1].asnumpy())  # skip policy: any graph, the same step
        return
    with pytest.raises(RuntimeError, match="checks .* on the host after each call of the cell"):
        outer(*bad)
    step.compile(*bad)  # compiling the cell itself ahead of its first call (Model.build) is not refused
    if options.get("overflow_policy") == "raise":  # called itself, the same cell still raises
        with pytest.raises(PersistentOverflowError, match="already at its minimum 1"):
            step(*bad)
    elif options.get("overflow_policy") == "warn":
        with pytest.warns(RuntimeWarning, match="already at its minimum 1"):
            step(*bad)
    else:
        assert bool(step(*bad)[1].asnumpy()) and step.overflow_reports[0]["step"] == 1

    @ms.jit
    def compiled_after_the_cells_own_calls(x, y):
        return step(x, y)

    with pytest.raises(RuntimeError, match="checks .* on the host after each call of the cell"):
        compiled_after_the_cells_own_calls(*bad)  # the cell's own compile and call ended: refused still


@pytest.mark.slow
def test_warn_once_and_skip_never_complains():
    step = _policy_step(overflow_policy="warn", max_consecutive_overflows=2)
    bad = _tensors(_poisoned(regression_batches(1)[0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            step(*bad)
    assert [(str(w.message).split(":")[0], w.filename) for w in caught] == [("Persistent overflow at step 2", __file__)]
    quiet = _policy_step(manager=_dynamic(init_loss_scale=1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            quiet(*bad)
    assert quiet.overflow_counters()["consecutive_overflows"] == 3


def test_counters_saturate_instead_of_wrapping():
    step = _policy_step()
    for counter in (step.steps, step.skipped_steps, step.consecutive_overflows):
        counter.set_data(Tensor(INT32_MAX - 1, mstype.int32))
    bad = _tensors(_poisoned(regression_batches(1)[0]))
    for _ in range(3):
        step(*bad)
    assert step.overflow_counters() == {
        "steps": INT32_MAX,
        "skipped_steps": INT32_MAX,
        "consecutive_overflows": INT32_MAX,
        "last_overflow_step": INT32_MAX,
    }


# ---- 5. observability ---------------------------------------------------------------------------------

KNOWN_OVERFLOWS = [False, True, True, False, True, False, False]  # steps 2, 3 and 5 overflow


def test_counters_follow_a_known_sequence():
    step = _policy_step()
    for batch, flag in zip(regression_batches(7), KNOWN_OVERFLOWS):
        step(*_tensors(_poisoned(batch) if flag else batch))
    assert step.overflow_counters() == {
        "steps": 7,
        "skipped_steps": 3,
        "consecutive_overflows": 0,
        "last_overflow_step": 5,
    }


def test_an_applied_overflow_is_counted_but_not_skipped():
    """drop_overflow_update=False applies every step (MindSpore's meaning): an overflowing step is an overflow in
    the counters, not a skipped step. (GradCapture 'applies' a step by storing its gradients, so the infs it is
    given do not poison the later steps.)"""
    net = regression_net()
    opt = GradCapture(net.trainable_params())
    step = TrainOneStepWithLossScaleCell(net, opt, Tensor(np.float32(1024.0)), drop_overflow_update=False)
    infs_applied = []
    for batch, flag in zip(regression_batches(7), KNOWN_OVERFLOWS):
        outputs = step(*_tensors(_poisoned(batch) if flag else batch))
        assert bool(outputs[1].asnumpy()) == flag
        infs_applied.append(not all(np.isfinite(g.asnumpy()).all() for g in opt.captured))
    assert infs_applied == KNOWN_OVERFLOWS
    assert step.overflow_counters() == {
        "steps": 7,
        "skipped_steps": 0,
        "consecutive_overflows": 0,
        "last_overflow_step": 5,
    }


def test_monitor_reports_device_counters(capsys):
    import mindspore.dataset as ds

    from lossscale import LossScaleMonitor

    rng = np.random.RandomState(0)
    x = rng.randn(16, 6).astype(np.float32)
    x[5, 0] = np.inf
    data = ds.NumpySlicesDataset({"x": x, "y": rng.randn(16, 3).astype(np.float32)}, shuffle=False).batch(4)
    net = nn.Dense(6, 3)
    monitor = LossScaleMonitor()
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01), loss_scale_manager=_dynamic()).train(
        1, data, callbacks=[monitor]
    )
    assert monitor.device_counters == {
        "steps": 4,
        "skipped_steps": 1,
        "consecutive_overflows": 0,
        "last_overflow_step": 2,
    }
    assert "device counters: 4 optimizer steps, 1 skipped" in capsys.readouterr().out


# ---- 6. forensics ----------------------------------------------------------------------------------------


class TwoInputs(nn.Cell):
    """``loss = mean(a * x) + mean(b * z)``: d/da = x, d/db = z."""

    def __init__(self):
        super().__init__()
        self.a = Parameter(Tensor(np.ones(3, np.float32)), name="a")
        self.b = Parameter(Tensor(np.ones(2, np.float32)), name="b")

    def construct(self, x, z):
        return ops.reduce_mean(self.a * x) + ops.reduce_mean(self.b * z)


def test_forensics_names_the_parameters_and_the_loss(caplog):
    net = TwoInputs()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), _dynamic().get_update_cell(), debug_overflow=True
    )
    ones3, ones2 = Tensor(np.ones(3, np.float32)), Tensor(np.ones(2, np.float32))
    with caplog.at_level(logging.WARNING, logger="lossscale"):
        step(ones3, Tensor(np.array([1.0, np.nan], np.float32)))
        step(ones3, ones2)
        step(Tensor(np.array([np.inf, 1.0, 1.0], np.float32)), ones2)
    assert step.overflow_reports == [
        {"step": 1, "loss_nonfinite": True, "parameters": ["b"]},
        {"step": 3, "loss_nonfinite": True, "parameters": ["a"]},
    ]
    assert "overflow at step 3: loss non-finite: True; non-finite gradients: a" in caplog.text


def test_forensics_with_accumulation_name_every_micro_batch_of_the_window():
    """The flags are ORed over an accumulation window (an overflow in its first micro-batch is still named at its
    end) and start afresh with the next window."""
    net = TwoInputs()
    step = TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.1),
        _dynamic().get_update_cell(),
        debug_overflow=True,
        accumulation_steps=2,
    )
    ones3, ones2 = Tensor(np.ones(3, np.float32)), Tensor(np.ones(2, np.float32))
    nan_b, inf_a = Tensor(np.array([1.0, np.nan], np.float32)), Tensor(np.array([np.inf, 1.0, 1.0], np.float32))
    windows = [((ones3, nan_b), (inf_a, ones2)), ((inf_a, ones2), (ones3, ones2)), ((ones3, ones2), (ones3, nan_b))]
    for first, second in windows:
        step(*first)
        step(*second)
    assert step.overflow_reports == [
        {"step": 1, "loss_nonfinite": True, "parameters": ["a", "b"]},
        {"step": 2, "loss_nonfinite": True, "parameters": ["a"]},
        {"step": 3, "loss_nonfinite": True, "parameters": ["b"]},
    ]


def test_forensics_with_a_non_finite_loss_only():
    net = LossPlusInput()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), _dynamic().get_update_cell(), debug_overflow=True
    )
    step(Tensor(np.ones(3, np.float32)), Tensor(np.float32(np.inf)))
    assert step.overflow_reports == [{"step": 1, "loss_nonfinite": True, "parameters": []}]


def test_forensics_off_adds_no_state():
    step = _policy_step()
    assert not hasattr(step, "nonfinite_grads") and step.overflow_reports == []
    assert not any("nonfinite" in p.name for p in step.get_parameters())


# ---- 7. bad input -----------------------------------------------------------------------------------------

BAD_FEATURE_ARGUMENTS = [
    (dict(clip_global_norm=0.0), ValueError, "'clip_global_norm'.*0.0"),
    (dict(clip_global_norm=float("inf")), ValueError, "'clip_global_norm'.*inf"),
    (dict(clip_global_norm="1"), TypeError, "'clip_global_norm'"),
    (dict(accumulation_steps=0), ValueError, r"'accumulation_steps'.*\[1, "),
    (dict(accumulation_steps=2.0), TypeError, "'accumulation_steps'"),
    (dict(overflow_policy="ignore"), ValueError, "'overflow_policy'.*'ignore'"),
    (dict(max_consecutive_overflows=3), ValueError, "needs overflow_policy='warn' or 'raise'"),
    (dict(overflow_policy="raise", max_consecutive_overflows=0), ValueError, "'max_consecutive_overflows'"),
    (dict(debug_overflow="yes"), TypeError, "'debug_overflow'"),
    (dict(overflow_check="tpu"), ValueError, "'overflow_check' must be one of .* but got 'tpu'"),
    (dict(extra_outputs=1), TypeError, "'extra_outputs' must be a bool"),
    (dict(lr_per_micro_batch="no"), TypeError, "'lr_per_micro_batch' must be a bool"),
]


@pytest.mark.parametrize("kwargs, error, pattern", BAD_FEATURE_ARGUMENTS)
def test_bad_feature_arguments(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        _policy_step(**kwargs)


@pytest.mark.parametrize("kwargs, error, pattern", BAD_FEATURE_ARGUMENTS)
def test_model_refuses_bad_feature_arguments_when_built(kwargs, error, pattern):
    """Model checks its train-cell options at construction (it builds the cell only when training starts)."""
    net = regression_net()
    with pytest.raises(error, match=pattern):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), loss_scale_manager=_dynamic(), **kwargs)


def test_model_checks_every_train_cell_option_with_the_train_cells_defaults():
    """Model's early check reads the option defaults from the train cell's signature (one source of truth)."""
    from lossscale.training.integration import TRAIN_CELL_OPTIONS, _train_cell_defaults

    keyword_only = {
        name
        for name, parameter in inspect.signature(TrainOneStepWithLossScaleCell).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(TRAIN_CELL_OPTIONS) == keyword_only - {"drop_overflow_update"}
    assert _train_cell_defaults()["overflow_policy"] == "skip" and _train_cell_defaults()["accumulation_steps"] == 1


def test_build_train_network_rejects_unknown_keywords():
    net = regression_net()
    with pytest.raises(ValueError, match="'clip_norm'"):
        build_train_network(net, nn.SGD(net.trainable_params(), 0.1), clip_norm=1.0)


def test_overridden_get_overflow_status_is_honoured():
    class AlwaysOverflow(TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(ops.isfinite(Tensor(np.inf, mstype.float32)))

    net = regression_net()
    step = AlwaysOverflow(net, nn.SGD(net.trainable_params(), 0.1), FixedLossScaleManager(8.0).get_update_cell())
    before = training_state(step)
    assert bool(step(*_tensors(regression_batches(1)[0]))[1].asnumpy())
    assert changed_since(before, step) == []


_scale_gradient = ops.MultitypeFuncGraph("_scale_gradient")


@_scale_gradient.register("Tensor", "Tensor")
def _tensor_scale_gradient(scale, grad):
    return grad * ops.cast(ops.Reciprocal()(scale), ops.dtype(grad))


class MindSporeBody(TrainOneStepWithLossScaleCell):
    """A subclass with the ``construct`` of MindSpore's own cell, as model-zoo cells copy it."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, scaling_sens_filled)
        grads = self.hyper_map(ops.partial(_scale_gradient, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens


_nonfinite_count = ops.MultitypeFuncGraph("_nonfinite_count")


@_nonfinite_count.register("Tensor")
def _tensor_nonfinite_count(grad):
    return ops.logical_not(ops.isfinite(grad)).astype(mstype.float32).sum()


class ModelZooStatus(MindSporeBody):
    """MindSpore 1.x model-zoo cells (BERT, GPT, ...) also copy the overflow check: a status register read, then
    reduced with the base class's primitives and flags. Here the register is a CPU stand-in (counts of non-finite
    values), the reduction is theirs."""

    def get_overflow_status(self, status, compute_output):
        flag_sum = self.reduce_sum(ops.stack(self.hyper_map(_nonfinite_count, compute_output)), (0,))
        if self.is_distributed:
            flag_sum = self.allreduce(flag_sum)
        return self.less_equal(self.base, flag_sum)


class StatusOfItsOwn(MindSporeBody):
    """mindocr's ``TrainOneStepWrapper`` skips ``start_overflow_check`` on CPU and passes ``status = True`` to
    ``get_overflow_status``; mindone's, since MindSpore 2.1, passes ``Tensor([0] * 8, int32)`` everywhere."""

    own_status = True

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss) * scaling_sens)
        grads = self.hyper_map(ops.partial(_scale_gradient, scaling_sens), grads)
        cond = self.get_overflow_status(self.own_status, grads)
        overflow = self.process_loss_scale(cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens


class MindoneStatus(StatusOfItsOwn):
    own_status = Tensor([0] * 8, mstype.int32)


@pytest.mark.slow
def test_a_subclass_with_mindspores_own_construct_trains_like_the_cell_on_cpu():
    """MindSpore's construct body, written against our cell, runs on CPU with our check and update cell: the
    same decisions, scales and (float32) weights as our own construct. It gets what its body calls: no counters.
    A model-zoo overflow check written with MindSpore's cell's primitives (self.reduce_sum, self.less_equal,
    self.base, self.is_distributed, self.allreduce) decides the same (our cell has those attributes too), and
    so do mindocr's and mindone's, which give get_overflow_status a status of their own (MindSpore's cell fails on
    CPU with either)."""
    policy = dict(init_loss_scale=2**10, scale_factor=2, scale_window=2)
    runs = []
    for cls in (TrainOneStepWithLossScaleCell, MindSporeBody, ModelZooStatus, StatusOfItsOwn, MindoneStatus):
        net = regression_net()
        step = cls(net, nn.SGD(net.trainable_params(), 0.05), DynamicLossScaleManager(**policy).get_update_cell())
        runs.append((step, train_calls(step, regression_batches(7), inject={1, 4, 5})))
    (ours, ours_run), (theirs, theirs_run) = runs[:2]
    assert ours_run[1:] == (
        [False, True, False, False, True, True, False],
        [1024.0, 512.0, 512.0, 1024.0, 512.0, 256.0, 256.0],
    )
    for other, other_run in runs[1:]:
        assert other_run[1:] == ours_run[1:], type(other).__name__
        assert all(np.array_equal(v, training_state(other)[k]) for k, v in training_state(ours).items())
    assert theirs.overflow_counters()["steps"] == 0 and ours.overflow_counters()["skipped_steps"] == 3


class ModelZooCell(TrainOneStepWithLossScaleCell):
    """The ``__init__`` and ``construct`` of MindSpore's model-zoo cells (BERT's ``BertTrainOneStepWithLossScaleCell``,
    GPT, FILIP, ...): they assign the update cell again and keep a scale Parameter of their own, ``loss_scale``,
    which they pass to the update cell."""

    def __init__(self, network, optimizer, scale_update_cell=None):
        super().__init__(network, optimizer, scale_update_cell)
        self.cast = ops.Cast()
        self.degree = 1
        self.loss_scale = None
        self.loss_scaling_manager = scale_update_cell
        if scale_update_cell:
            self.loss_scale = Parameter(Tensor(scale_update_cell.get_loss_scale(), dtype=mstype.float32))

    def construct(self, x, y, sens=None):
        weights = self.weights
        loss = self.network(x, y)
        scaling_sens = self.loss_scale if sens is None else sens
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        grads = self.grad(self.network, weights)(x, y, self.cast(scaling_sens, mstype.float32))
        grads = self.grad_reducer(grads)
        degree_sens = self.cast(scaling_sens * self.degree, mstype.float32)
        grads = self.hyper_map(ops.partial(_scale_gradient, degree_sens), grads)
        cond = self.get_overflow_status(status, grads)
        overflow = cond
        if sens is None:
            overflow = self.loss_scaling_manager(self.loss_scale, cond)
        if not overflow:
            self.optimizer(grads)
        return loss, cond, scaling_sens


@pytest.mark.slow
def test_a_model_zoo_subclass_that_assigns_the_update_cell_again_trains_like_the_cell_on_cpu():
    """Building one was nn.Cell's KeyError ("the loss_scaling_manager child cell already exists"). Now it trains with
    its own scale Parameter and our update cell and check: the same decisions, scales and weights as our
    construct. Its construct never writes ``scale_sense``, so ``get_loss_scale()`` keeps reading the initial
    scale, as MindSpore's cell's ``scale_sense`` stays put under such a subclass."""
    policy = dict(init_loss_scale=2**10, scale_factor=2, scale_window=2)
    runs = []
    for cls in (TrainOneStepWithLossScaleCell, ModelZooCell):
        net = regression_net()
        step = cls(net, nn.SGD(net.trainable_params(), 0.05), DynamicLossScaleManager(**policy).get_update_cell())
        runs.append((net, step, train_calls(step, regression_batches(7), inject={1, 4, 5})))
    (ours_net, ours, ours_run), (zoo_net, zoo, zoo_run) = runs
    assert (
        zoo_run[1:]
        == ours_run[1:]
        == ([False, True, False, False, True, True, False], [1024.0, 512.0, 512.0, 1024.0, 512.0, 256.0, 256.0])
    )
    assert all(
        np.array_equal(a.asnumpy(), b.asnumpy())
        for a, b in zip(ours_net.trainable_params(), zoo_net.trainable_params())
    )
    assert float(zoo.loss_scale.asnumpy()) == ours.get_loss_scale() == 256.0 and zoo.get_loss_scale() == 1024.0


class OwnOptions(TrainOneStepWithLossScaleCell):
    """As mindone's ``TrainOneStepWrapper`` (a subclass of MindSpore's cell): it assigns ``drop_overflow_update``
    (and, as model-zoo accumulation cells, ``accumulation`` and ``accumulation_steps``) for its own construct,
    which applies an overflowed step when ``drop_overflow_update`` is False."""

    def __init__(self, network, optimizer, scale_sense, drop_overflow_update=True, gradient_accumulation_steps=1):
        super().__init__(network, optimizer, scale_sense)
        self.accumulation = False  # model-zoo TrainAccuStepsWithLossScaleCell: True while accumulating
        self.drop_overflow_update = drop_overflow_update
        self.accumulation_steps = gradient_accumulation_steps

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss) * scaling_sens)
        grads = self.hyper_map(ops.partial(_scale_gradient, scaling_sens * self.accumulation_steps), grads)
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        if (not self.drop_overflow_update) or (not overflow):
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens


class OwnOptionsCallingOurConstruct(OwnOptions):
    def construct(self, *inputs):
        return TrainOneStepWithLossScaleCell.construct(self, *inputs)


@pytest.mark.parametrize("drop", [True, False])
def test_a_subclass_with_its_own_construct_may_assign_the_option_names_for_itself(drop, tmp_path):
    """mindone's TrainOneStepWrapper and model-zoo accumulation cells assign drop_overflow_update or accumulation_steps
    after building (read-only for our construct), and the zoo keeps a flag ``accumulation = False``, which the state
    check must not take for our accumulation part. With a construct of their own the names are theirs: the
    attributes read their values, their compiled construct uses them (an injected inf is applied when their
    drop_overflow_update is False), and our checks and checkpoints see the cell as built (no accumulation). A
    subclass that assigns them but runs our construct is refused before anything runs; one without a construct of
    its own still gets the AttributeError."""
    net = regression_net()
    cell = OwnOptions(
        net,
        nn.SGD(net.trainable_params(), 0.05),
        Tensor(np.float32(8.0)),
        drop_overflow_update=drop,
        gradient_accumulation_steps=2,
    )
    assert cell.drop_overflow_update is drop and cell.accumulation_steps == 2 and cell.accumulation is False
    _, flags, _ = train_calls(cell, regression_batches(2), inject={1})  # its state checked first: no accumulation
    assert flags == [False, True]
    weights = [p.asnumpy() for p in net.trainable_params()]
    assert all(np.isfinite(w).all() for w in weights) is drop  # the overflowed step applied only when not dropped
    path = str(tmp_path / "own_options.ckpt")
    ms.save_checkpoint(cell, path, choice_func=cell.checkpoint_choice())
    assert "scale_sense" in restore_loss_scale(cell, ms.load_checkpoint(path))

    calling_ours = OwnOptionsCallingOurConstruct(net, nn.SGD(net.trainable_params(), 0.05), Tensor(np.float32(8.0)))
    before = training_state(calling_ours)
    with pytest.raises(
        RuntimeError,
        match=r"assigned accumulation, drop_overflow_update, accumulation_steps after "
        r"TrainOneStepWithLossScaleCell.__init__ and still runs.*scale_sense, "
        r"drop_overflow_update=\.\.\.\)\) \(the accumulation part is built from "
        r"accumulation_steps\)",
    ):
        calling_ours(*map(Tensor, regression_batches(1)[0]))
    assert changed_since(before, calling_ours) == []

    class NoConstruct(TrainOneStepWithLossScaleCell):
        def __init__(self, network, optimizer, scale_sense):
            super().__init__(network, optimizer, scale_sense)
            self.accumulation_steps = 4

    with pytest.raises(AttributeError, match="NoConstruct.accumulation_steps cannot be assigned: the compiled step"):
        NoConstruct(net, nn.SGD(net.trainable_params(), 0.05), Tensor(np.float32(8.0)))


class ExtendsOurConstruct(TrainOneStepWithLossScaleCell):
    """A subclass whose construct runs ours and adds to it (here: the loss returned in float64)."""

    def construct(self, *inputs):
        loss, overflow, scale = super().construct(*inputs)
        return ops.cast(loss, mstype.float64), overflow, scale


@pytest.mark.parametrize(
    "option, value",
    [  # the README's tier: the first three (one refusal path); the slow tier every option
        ("drop_overflow_update", False),
        ("accumulation_steps", 2),
        ("clip_global_norm", 1.0),
        pytest.param("overflow_policy", "raise", marks=pytest.mark.slow),
        pytest.param("debug_overflow", True, marks=pytest.mark.slow),
        pytest.param("extra_outputs", True, marks=pytest.mark.slow),
        pytest.param("lr_per_micro_batch", True, marks=pytest.mark.slow),
    ],
)
def test_each_option_only_our_construct_honours_is_named_when_refused(option, value):
    """Each option that acts only in our construct, alone, refused for a subclass that never runs it (nothing runs)."""
    net = regression_net()
    body = MindSporeBody(
        net, nn.SGD(net.trainable_params(), 0.05), FixedLossScaleManager(8.0).get_update_cell(), **{option: value}
    )
    before = training_state(body)
    with pytest.raises(RuntimeError, match=f"^{option}={value!r} would have no effect"):
        body(*map(Tensor, regression_batches(1)[0]))
    assert changed_since(before, body) == []


@pytest.mark.slow
def test_options_only_our_construct_honours_are_refused_for_a_subclass_that_never_runs_it():
    """clip_global_norm or overflow_policy given to a subclass whose construct never runs ours did nothing, silently
    (MindSporeBody's construct neither clips nor counts). Now a RuntimeError at the first call, naming them, before
    anything runs. A subclass whose construct runs ours (super().construct) gets them: it trains as our cell."""
    options = dict(clip_global_norm=0.01, overflow_policy="warn", max_consecutive_overflows=3)
    net = regression_net()
    body = MindSporeBody(
        net, nn.SGD(net.trainable_params(), 0.05), FixedLossScaleManager(8.0).get_update_cell(), **options
    )
    before = training_state(body)
    with pytest.raises(
        RuntimeError,
        match=r"clip_global_norm=0.01, overflow_policy='warn' would have no effect: "
        r"MindSporeBody.construct does not run TrainOneStepWithLossScaleCell",
    ):
        body(*map(Tensor, regression_batches(1)[0]))
    assert changed_since(before, body) == []
    runs = []
    for cls in (TrainOneStepWithLossScaleCell, ExtendsOurConstruct):
        net = regression_net()
        cell = cls(net, nn.SGD(net.trainable_params(), 0.05), FixedLossScaleManager(8.0).get_update_cell(), **options)
        runs.append((train_calls(cell, regression_batches(3), inject={1})[1], training_state(net)))
    (ours_flags, ours_state), (extended_flags, extended_state) = runs
    assert extended_flags == ours_flags == [False, True, False]
    assert all(np.array_equal(extended_state[name], value) for name, value in ours_state.items())


# ---- property-based invariants -----------------------------------------------------------------------------

_PROPERTY_POLICY = dict(
    init_loss_scale=2**6, scale_factor=2, scale_window=2, hysteresis=2, min_loss_scale=2.0, max_loss_scale=2.0**8
)


@pytest.fixture(scope="module")
def property_step():
    net = regression_net()
    manager = DynamicLossScaleManager(**_PROPERTY_POLICY)
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.05), manager.get_update_cell())
    return step, manager, snapshot(step)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.booleans(), min_size=1, max_size=25), bad=st.sampled_from([np.inf, -np.inf, np.nan]))
@pytest.mark.slow
def test_invariants_on_random_overflow_sequences(property_step, flags, bad):
    step, manager, initial = property_step
    for parameter in step.get_parameters():
        parameter.set_data(Tensor(initial[parameter.name]))
    batches = regression_batches(len(flags), seed=7)
    expected = run(manager.policy, flags)
    for batch, flag, state in zip(batches, flags, expected):
        before = training_state(step)
        _, overflow, scale = step(*_tensors(_poisoned(batch, bad) if flag else batch))
        assert bool(overflow.asnumpy()) == flag  # skipped exactly when overflowing
        assert (changed_since(before, step) == []) == flag  # weights move only on clean steps
        scale = float(scale.asnumpy())
        assert scale == state.scale and np.isfinite(scale)  # the policy, step for step
        assert _PROPERTY_POLICY["min_loss_scale"] <= scale <= _PROPERTY_POLICY["max_loss_scale"]
    assert step.overflow_counters()["skipped_steps"] == sum(flags)
