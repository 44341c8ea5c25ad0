"""Train cell, Model and checkpoints: no silent failure. One regression test per defect of issue 13 (each
failed on the code before it), checkpoint paths as differential runs against an uninterrupted run; and the
core's arithmetic, which every front-end shares (float64 gradients)."""

import contextlib
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, context, nn, ops
from mindspore.common import dtype as mstype
from nets import (
    Float64Regression,
    PlainSGD,
    changed_since,
    regression_batches,
    regression_net,
    snapshot,
    train_calls,
    training_state,
)

from lossscale import (
    DynamicLossScaleManager,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    GradScaler,
    LossScaleOptimizer,
    LossScalePolicy,
    LossScaler,
    Model,
    PersistentOverflowError,
    TrainOneStepWithLossScaleCell,
    build_train_network,
)
from lossscale.training.checkpoints import check_cell_state, checkpoint_choice, restore_loss_scale

BATCHES = regression_batches(8, seed=11)


def _dynamic_cell(net=None, **kwargs):
    net = net or regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=2, **kwargs)
    return TrainOneStepWithLossScaleCell(net, nn.Momentum(net.trainable_params(), 0.02, 0.9), manager.get_update_cell())


def _run(cell, batches, inject=()):
    """Call ``cell`` on ``batches`` (an inf in the input of the calls in ``inject``); return flags and scales."""
    return train_calls(cell, batches, inject)[1:]


def _same_weights(a, b):
    for name, value in training_state(a).items():
        np.testing.assert_array_equal(training_state(b)[name], value, err_msg=name)


def _checkpoint(cell, path):
    ms.save_checkpoint(cell, str(path))
    return ms.load_checkpoint(str(path))


# ---- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_fixed_scale_recipe_keeps_its_scale_when_a_checkpoint_of_another_scale_is_loaded(tmp_path):
    """MindSpore's recipe: FixedLossScaleManager(S, False) and an optimizer with loss_scale=S. A checkpoint of a
    dynamic run (scale_sense = 2**16) used to replace the scale while the optimizer kept dividing by S."""
    dynamic = _dynamic_cell()
    dynamic.set_sense_scale(Tensor(np.float32(2**16)))
    saved = _checkpoint(dynamic, tmp_path / "dynamic.ckpt")

    def recipe():
        net = regression_net()
        manager = FixedLossScaleManager(1024.0, drop_overflow_update=False)
        cell = build_train_network(
            net,
            nn.Momentum(net.trainable_params(), 0.02, 0.9, loss_scale=1024.0),
            level="O0",
            loss_scale_manager=manager,
        )
        return cell, manager

    resumed, manager = recipe()
    not_loaded, unused = ms.load_param_into_net(resumed, saved)
    assert "scale_sense" in unused and "scale_sense" not in {p.name for p in resumed.get_parameters()}
    uninterrupted, _ = recipe()
    ms.load_param_into_net(uninterrupted, {k: v for k, v in saved.items() if k != "scale_sense"})
    assert _run(resumed, BATCHES) == _run(uninterrupted, BATCHES)
    _same_weights(resumed, uninterrupted)
    assert resumed.get_loss_scale() == manager.get_loss_scale() == 1024.0 and not_loaded == []


def test_an_inf_scale_in_a_checkpoint_is_refused_before_the_first_step(tmp_path):
    """MindSpore's own cell writes inf once its scale grows past 2**127; such a checkpoint used to skip every
    step forever, silently, and overflow_policy='raise' never fired."""
    source = _dynamic_cell()
    source.loss_scaler.scale_value.set_data(Tensor(np.float32(np.inf)))
    saved = _checkpoint(source, tmp_path / "inf.ckpt")
    target = _dynamic_cell()
    ms.load_param_into_net(target, saved)
    before = snapshot(target)
    x, y = BATCHES[0]
    with pytest.raises(ValueError, match=r"'scale_sense' holds inf: a loss scale must be finite and > 0"):
        target(Tensor(x), Tensor(y))
    assert changed_since(before, target, snapshot) == []
    target.load_state_dict({"loss_scale": 1024.0, "good_steps": 0, "hysteresis_left": 1})
    assert _run(target, BATCHES[:2]) == ([False, False], [1024.0, 2048.0])


def test_counters_of_another_configuration_are_refused(tmp_path):
    """A hysteresis_left of 3 from a hysteresis-3 run, loaded into a hysteresis-1 cell, used to absorb overflows."""
    source = _dynamic_cell(hysteresis=3)
    saved = _checkpoint(source, tmp_path / "h3.ckpt")
    target = _dynamic_cell()
    ms.load_param_into_net(target, saved)
    with pytest.raises(
        ValueError,
        match=r"'loss_scale_hysteresis_left' must be an int in \[1, 1\], but got 3\. "
        r"The loaded state does not belong",
    ):
        target.check_state()
    counters = _dynamic_cell()
    counters.counters.steps.set_data(Tensor(-5, mstype.int32))
    with pytest.raises(ValueError, match=r"'loss_scale_steps' must be an int in \[0, 2147483647\], but got -5\."):
        counters.check_state()


def _accumulating_cell():
    net = regression_net()
    return TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.02),
        DynamicLossScaleManager(2**12, scale_window=2).get_update_cell(),
        accumulation_steps=3,
    )


def _fixed_cell():
    net = regression_net()
    return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.02), FixedLossScaleUpdateCell(1024.0))


# (cell, Parameter name, value written as a checkpoint load would, message)
FOREIGN_STATES = [
    (
        lambda: _dynamic_cell(max_loss_scale=2.0**14),
        "scale_sense",
        np.float32(2.0**15),
        r"'scale_sense' must be a finite number in \[1\.0, 16384\.0\], but got 32768\.0\.",
    ),
    (
        lambda: _dynamic_cell(min_loss_scale=4.0),
        "scale_sense",
        np.float32(2.0),
        r"'scale_sense' must be a finite number in \[4\.0, ",
    ),
    (
        _dynamic_cell,
        "loss_scale_good_steps",
        np.int32(2),
        r"'loss_scale_good_steps' must be an int in \[0, 1\], but got 2\.",
    ),
    (
        _fixed_cell,
        "scale_sense",
        np.float32(2048.0),
        r"'scale_sense' must equal the fixed loss scale 1024\.0, but got 2048\.0\.",
    ),
    (
        _accumulating_cell,
        "loss_scale_micro_step",
        np.int32(3),
        r"'loss_scale_micro_step' must be an int in \[0, 2\], but got 3\.",
    ),
]


@pytest.mark.parametrize(
    "make, name, value, message",
    FOREIGN_STATES,
    ids=["above_max", "below_min", "good_steps", "fixed_scale_changed", "micro_step"],
)
def test_a_loaded_state_outside_the_cells_rule_is_refused_before_the_first_step(make, name, value, message):
    cell = make()
    parameter = next(p for p in cell.get_parameters() if p.name == name)
    ms.load_param_into_net(cell, {name: Parameter(Tensor(value), name=name)})
    before = snapshot(cell)
    x, y = BATCHES[0]
    with pytest.raises(ValueError, match=message + ".*does not belong to this train cell's configuration"):
        cell(Tensor(x), Tensor(y))
    assert parameter.asnumpy().item() == value.item()
    assert changed_since(before, cell, snapshot) == []  # nothing ran


def test_the_update_cell_recovers_from_a_state_loaded_after_the_first_step():
    """A load after the first step is not checked on the host; the update cell brings the state back within
    its rule instead of keeping inf (inf * 0.5 is inf)."""
    cell = _dynamic_cell(max_loss_scale=2.0**20)
    _run(cell, BATCHES[:1])
    cell.loss_scaler.scale_value.set_data(Tensor(np.float32(np.inf)))
    flags, scales = _run(cell, BATCHES[1:3])
    assert flags == [True, False] and scales == [2.0**19, 2.0**19]


@pytest.mark.slow
def test_weights_only_checkpoint_starts_the_scale_fresh(tmp_path):
    trained = _dynamic_cell()
    _run(trained, BATCHES[:3], inject={1})
    weights = {
        k: v
        for k, v in _checkpoint(trained, tmp_path / "all.ckpt").items()
        if not k.startswith(("scale_sense", "loss_scale_"))
    }
    resumed, fresh = _dynamic_cell(), _dynamic_cell()
    ms.load_param_into_net(resumed, weights)
    ms.load_param_into_net(fresh, weights)
    assert resumed.get_loss_scale() == 4096.0
    assert _run(resumed, BATCHES[3:]) == _run(fresh, BATCHES[3:])
    _same_weights(resumed, fresh)


@pytest.mark.slow
def test_a_checkpoint_loaded_into_the_bare_network_restores_the_scale_with_restore_loss_scale(tmp_path):
    """The usual MindSpore way (load_param_into_net(network, ckpt), then the train cell) silently restarted the
    scale; restore_loss_scale(cell, ckpt) continues exactly as the uninterrupted run."""
    uninterrupted = _dynamic_cell()
    _run(uninterrupted, BATCHES[:4], inject={1})
    saved = _checkpoint(uninterrupted, tmp_path / "cell.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = _dynamic_cell(net=network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert resumed.get_loss_scale() == 4096.0  # what the bare-network load gives: the initial scale
    names = restore_loss_scale(resumed, saved)
    assert "scale_sense" in names and resumed.get_loss_scale() == uninterrupted.get_loss_scale()
    assert _run(resumed, BATCHES[4:], inject={6}) == _run(uninterrupted, BATCHES[4:], inject={6})
    _same_weights(resumed, uninterrupted)
    with pytest.raises(ValueError, match="holds none of this train cell's loss-scale state"):
        restore_loss_scale(
            _dynamic_cell(), {k: v for k, v in saved.items() if not k.startswith("loss_scale_") and k != "scale_sense"}
        )


class _MindSporeLossScaleState(nn.Cell):
    """What a checkpoint of MindSpore's own train cell holds of the loss scale: its ``scale_sense`` and its dynamic
    update cell's counters (its train cell cannot run on CPU; its update cell can)."""

    def __init__(self, init_scale, window):
        super().__init__(auto_prefix=False)
        self.scale_sense = Parameter(Tensor(np.float32(init_scale)), name="scale_sense")
        self.update_cell = nn.DynamicLossScaleUpdateCell(init_scale, 2, window)

    def construct(self, overflow):
        return self.update_cell(self.scale_sense, overflow)


@pytest.mark.slow
def test_restore_loss_scale_continues_a_checkpoint_of_mindspores_own_cell(tmp_path):
    """MindSpore's update cell counts steps (current_iterator_step, last_overflow_iterator_step), ours the clean
    steps in a row: restore_loss_scale translates them, so a run moved from MindSpore's cell to ours continues as
    ours would have (the two rules agree below the ceiling). Without the translation the clean steps were lost
    and growth came a window late."""
    uninterrupted = _dynamic_cell()
    flags, scales = _run(uninterrupted, BATCHES, inject={1, 4})
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    for flag in flags[:6]:  # a clean step ends the saved part: the count is 1 of a window of 2
        theirs(Tensor(flag))
    saved = _checkpoint(theirs, tmp_path / "mindspore_cell.ckpt")
    assert float(saved["scale_sense"].asnumpy()) == scales[5]
    resumed = _dynamic_cell()
    assert restore_loss_scale(resumed, saved) == ["loss_scale_good_steps", "scale_sense"]
    assert _run(resumed, BATCHES[6:]) == (flags[6:], scales[6:]) and scales[6] == 2 * scales[5]
    longer_window = _MindSporeLossScaleState(2.0**12, 8)  # 3 clean steps: more than a window of 2 allows
    for _ in range(3):
        longer_window(Tensor(False))
    target = _dynamic_cell()
    with pytest.raises(ValueError, match="loss_scale_good_steps"):
        restore_loss_scale(target, _checkpoint(longer_window, tmp_path / "window8.ckpt"))
    assert target.state_dict()["good_steps"] == 0 and target.get_loss_scale() == 2.0**12


@pytest.mark.slow
def test_load_param_into_net_continues_a_checkpoint_of_mindspores_own_cell_as_restore_loss_scale(tmp_path):
    """The same checkpoint loaded the usual MindSpore way, into the train cell: its step counters are received under
    their names and become the clean-step count before the next step (growth came up to a window late), and the
    counters are put back to a fresh cell's, so that a later check does not apply them again."""
    uninterrupted = _dynamic_cell()
    flags, scales = _run(uninterrupted, BATCHES, inject={1, 4})
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    for flag in flags[:6]:
        theirs(Tensor(flag))
    resumed = _dynamic_cell()
    ms.load_param_into_net(resumed, _checkpoint(theirs, tmp_path / "mindspore_cell.ckpt"))
    assert _run(resumed, BATCHES[6:7]) == (flags[6:7], scales[6:7]) and scales[6] == 2 * scales[5]
    resumed.check_state()
    assert _run(resumed, BATCHES[7:]) == (flags[7:], scales[7:])
    longer_window = _MindSporeLossScaleState(2.0**12, 8)  # 3 clean steps: more than a window of 2 allows
    for _ in range(3):
        longer_window(Tensor(False))
    target = _dynamic_cell()
    ms.load_param_into_net(target, _checkpoint(longer_window, tmp_path / "window8.ckpt"))
    with pytest.raises(ValueError, match="loss_scale_good_steps"):
        target(*(Tensor(a) for a in BATCHES[0]))
    assert target.state_dict()["good_steps"] == 0 and target.overflow_counters()["steps"] == 0


@pytest.mark.parametrize("ours, expected", [(None, 1), (0, 0)], ids=["MindSpore's only", "both"])
def test_restore_loss_scale_translates_mindspores_counters_only_without_ours(ours, expected, tmp_path):
    """A checkpoint holding our clean-step count as well as MindSpore's step numbers restores ours as saved; the
    translation is for a checkpoint without it (one clean step: MindSpore's counters say 1)."""
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    theirs(Tensor(False))
    saved = _checkpoint(theirs, tmp_path / "mindspore_cell.ckpt")
    if ours is not None:
        saved["loss_scale_good_steps"] = Parameter(Tensor(np.int32(ours)), name="loss_scale_good_steps")
    resumed = _dynamic_cell()
    assert restore_loss_scale(resumed, saved) == ["loss_scale_good_steps", "scale_sense"]
    assert resumed.state_dict()["good_steps"] == expected


def _cell_with_mindspores_update_cell(net=None):
    net = net or regression_net()
    return TrainOneStepWithLossScaleCell(
        net, nn.Momentum(net.trainable_params(), 0.02, 0.9), nn.DynamicLossScaleUpdateCell(2.0**12, 2, 2)
    )


@pytest.mark.slow
def test_restore_loss_scale_keeps_the_counters_of_mindspores_update_cell_in_our_cell(tmp_path):
    """Our train cell also runs MindSpore's own update cell; restore_loss_scale restored only scale_sense of it and
    left its step counters behind, so growth came late after a resume."""
    cell = _cell_with_mindspores_update_cell
    uninterrupted = cell()
    flags, scales = _run(uninterrupted, BATCHES[:6], inject={1, 4})
    saved = _checkpoint(uninterrupted, tmp_path / "ms_update_cell.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = cell(network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert {"current_iterator_step", "last_overflow_iterator_step", "scale_sense"} <= set(
        restore_loss_scale(resumed, saved)
    )
    assert _run(resumed, BATCHES[6:]) == _run(uninterrupted, BATCHES[6:])
    _same_weights(resumed, uninterrupted)


@pytest.mark.slow
def test_state_dict_of_a_cell_with_mindspores_update_cell_keeps_the_clean_steps():
    """With MindSpore's own update cell, state_dict() held the scale only: a resume from it lost the clean steps
    counted so far (growth a window late). It now holds them as good_steps, in our format, and loads them into a
    fresh cell and into one that has run (whose last overflow came after the saved one: MindSpore's cell keeps
    step numbers, so both of them are rewritten); a value beyond the cell's window is refused and changes
    nothing; a scale-only state (0.1.0's) still loads."""
    uninterrupted = _cell_with_mindspores_update_cell()
    _run(uninterrupted, BATCHES[:6], inject={1, 4})
    state = uninterrupted.state_dict()
    assert state == {"loss_scale": 2.0**11, "good_steps": 1}
    weights = training_state(uninterrupted)
    resumed = [_cell_with_mindspores_update_cell(), _cell_with_mindspores_update_cell()]
    _run(resumed[1], BATCHES[:7], inject={6})
    for cell in resumed:
        ms.load_param_into_net(
            cell,
            {
                name: Parameter(Tensor(value), name=name)  # weights and optimizer state
                for name, value in weights.items()
            },
        )
        cell.load_state_dict(state)
        assert cell.state_dict() == state
    expected = _run(uninterrupted, BATCHES[6:])
    assert [_run(cell, BATCHES[6:]) for cell in resumed] == [expected, expected]
    target = _cell_with_mindspores_update_cell()
    with pytest.raises(ValueError, match=r"'state_dict\['good_steps'\]' must be an int in \[0, 1\], but got 2"):
        target.load_state_dict({"loss_scale": 512.0, "good_steps": 2})
    assert target.state_dict() == {"loss_scale": 2.0**12, "good_steps": 0}
    with pytest.raises(TypeError, match="'state_dict' must be a dict, but got NoneType"):
        target.load_state_dict(None)
    target.load_state_dict({"loss_scale": 512.0})
    assert target.state_dict() == {"loss_scale": 512.0, "good_steps": 0}


def test_restore_loss_scale_changes_nothing_when_the_state_is_invalid(tmp_path):
    source = _dynamic_cell(hysteresis=2)
    saved = _checkpoint(source, tmp_path / "h2.ckpt")
    target = _dynamic_cell()
    before = snapshot(target)
    with pytest.raises(ValueError, match="loss_scale_hysteresis_left"):
        restore_loss_scale(target, saved)
    assert changed_since(before, target, snapshot) == []
    reshaped = dict(saved, scale_sense=Parameter(Tensor(np.full((1, 1), 8.0, np.float32)), name="scale_sense"))
    with pytest.raises(
        ValueError,
        match=r"the checkpoint's 'scale_sense' has shape \(1, 1\), but this train "
        r"cell's has shape \(\)",
    ):
        restore_loss_scale(target, reshaped)  # (MindSpore's loader raised RuntimeError after a partial load)
    assert changed_since(before, target, snapshot) == []


def _refusal_cases():
    cell = _dynamic_cell()
    int32 = "must hold whole numbers in \\[-2147483648, 2147483647\\] \\(the Parameter is Int32\\)"
    return cell, [
        ((cell, None), TypeError, "'param_dict' must be a dict of Parameter names to values.*got NoneType"),
        ((cell, [("scale_sense", 8.0)]), TypeError, "'param_dict' must be a dict.*got list"),
        (
            (cell.network, {"scale_sense": 8.0}),
            TypeError,
            "'cell' must be a lossscale.TrainOneStepWithLossScaleCell, "
            "but got WithLossCell: a bare network's weights load with "
            "mindspore.load_param_into_net",
        ),
        (
            (GradScaler(), {"scale_sense": 8.0}),
            TypeError,
            "but got GradScaler: a GradScaler's state loads with its load_state_dict",
        ),
        (
            (DynamicLossScaleManager(), {}),
            TypeError,
            "but got DynamicLossScaleManager: a DynamicLossScaleManager's state loads with its load_state_dict",
        ),
        (
            (LossScaleOptimizer(nn.SGD(cell.network.trainable_params(), 0.1)), {}),
            TypeError,
            "but got LossScaleOptimizer: a LossScaleOptimizer's scale is one of its Parameters: "
            "mindspore.load_param_into_net\\(optimizer, checkpoint\\)",
        ),
        (
            (cell, {"loss_scale_good_steps": np.int32(1), "scale_sense": "8"}),
            TypeError,
            "the checkpoint's 'scale_sense' must hold numbers, but got '8' of type str",
        ),
        ((cell, {"loss_scale_good_steps": np.float32(1.5)}), ValueError, int32 + ", but got 1.5"),
        ((cell, {"loss_scale_good_steps": np.float32(np.nan)}), ValueError, int32 + ", but got nan"),
        # 2**32 + 1 would wrap to 1 in int32, which the state check then accepted
        ((cell, {"loss_scale_good_steps": np.int64(2**32 + 1)}), ValueError, int32 + ", but got 4294967297"),
    ]


def test_restore_loss_scale_refuses_bad_arguments_and_entries_before_writing_anything():
    """Not a train cell, not a dict: a TypeError naming the argument (was an AttributeError). An entry that is not
    a number, or a fractional, non-finite or out-of-range value for an integer counter: refused before anything
    is written (a string was MindSpore's conversion error after the earlier entries were written; 1.5 was
    truncated to 1, 2**32 + 1 wrapped to 1)."""
    cell, cases = _refusal_cases()
    before = snapshot(cell)
    for arguments, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            restore_loss_scale(*arguments)
        assert changed_since(before, cell, snapshot) == [], pattern
    for public in (check_cell_state, checkpoint_choice):
        with pytest.raises(
            TypeError, match="'cell' must be a lossscale.TrainOneStepWithLossScaleCell, but got WithLossCell"
        ):
            public(cell.network)
    assert restore_loss_scale(cell, {"loss_scale_good_steps": np.float64(1.0)}) == ["loss_scale_good_steps"]
    assert cell.state_dict()["good_steps"] == 1  # a whole float is a count


def _accumulating_cell(net=None):
    net = net or regression_net()
    return TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.05),
        DynamicLossScaleManager(2**10, scale_window=3).get_update_cell(),
        accumulation_steps=2,
    )


@pytest.mark.slow
def test_accumulators_are_left_out_of_checkpoints_at_window_boundaries(tmp_path):
    """And one choice function serves every later save: it reads the window's position at each save (it read it
    once, when built, so a function kept from a boundary dropped the partial sums of a mid-window save)."""
    cell = _accumulating_cell
    uninterrupted = cell()
    _run(uninterrupted, BATCHES[:4])
    path = tmp_path / "boundary.ckpt"
    choose = uninterrupted.checkpoint_choice()
    ms.save_checkpoint(uninterrupted, str(path), choice_func=choose)
    saved = ms.load_checkpoint(str(path))
    assert not [k for k in saved if k.startswith("loss_scale_accumulator.")] and "loss_scale_micro_step" in saved
    resumed = cell()
    not_loaded, _ = ms.load_param_into_net(resumed, saved)
    assert all(name.startswith("loss_scale_accumulator.") for name in not_loaded)
    assert _run(resumed, BATCHES[4:]) == _run(uninterrupted, BATCHES[4:])
    _same_weights(resumed, uninterrupted)
    _run(uninterrupted, BATCHES[:1])  # mid-window: the accumulators are kept, also by the function built before
    mid = tmp_path / "mid.ckpt"
    ms.save_checkpoint(uninterrupted, str(mid), choice_func=choose)
    assert [k for k in ms.load_checkpoint(str(mid)) if k.startswith("loss_scale_accumulator.")]


@pytest.mark.slow
def test_restore_loss_scale_refuses_a_mid_window_checkpoint_it_cannot_continue(tmp_path):
    """A checkpoint saved inside an accumulation window holds the window's partial sums: restored into an
    accumulating cell it continues exactly. It did not: restore_loss_scale loaded with MindSpore's
    load_param_into_net, whose suffix matching (for the weights the partial dict lacks) wrote each
    loss_scale_accumulator.<w> into <w>, so the weights became the partial sums. Restored into a cell without
    accumulation, or without the sums, the window's micro-batches were silently dropped (and, without the sums,
    the window's mean came out too small); refused now, and nothing changes."""
    uninterrupted = _accumulating_cell()
    _run(uninterrupted, BATCHES[:3])  # one micro-batch into the second window
    saved = _checkpoint(uninterrupted, tmp_path / "mid.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = _accumulating_cell(network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert "loss_scale_micro_step" in restore_loss_scale(resumed, saved)
    _same_weights(resumed, uninterrupted)
    assert _run(resumed, BATCHES[3:], inject={5}) == _run(uninterrupted, BATCHES[3:], inject={5})
    _same_weights(resumed, uninterrupted)
    without_sums = {k: v for k, v in saved.items() if not k.startswith("loss_scale_accumulator.")}
    no_window = r"inside an accumulation window \(loss_scale_micro_step=1\).* has no accumulation"
    for target, state, error in [
        (_dynamic_cell(), saved, no_window + r" \(accumulation_steps=1\)"),
        (_dynamic_cell(), {k: v.asnumpy() for k, v in saved.items()}, no_window),  # a dict of arrays too
        (
            _accumulating_cell(),
            without_sums,
            r"inside an accumulation window \(loss_scale_micro_step=1\) "
            r"without its partial sums \(loss_scale_accumulator\.",
        ),
    ]:
        before = snapshot(target)
        with pytest.raises(ValueError, match=error):
            restore_loss_scale(target, state)
        assert changed_since(before, target, snapshot) == []


def test_load_param_into_net_of_a_mid_window_checkpoint_into_a_cell_without_accumulation_is_refused(tmp_path):
    """As restore_loss_scale refuses it: the micro-batch count is received under its name, and the check before the
    first step refuses it (the window's micro-batches would be lost), changing nothing."""
    uninterrupted = _accumulating_cell()
    _run(uninterrupted, BATCHES[:3])  # one micro-batch into the second window
    target = _dynamic_cell()
    ms.load_param_into_net(target, _checkpoint(uninterrupted, tmp_path / "mid.ckpt"))
    before = snapshot(target)
    with pytest.raises(
        ValueError,
        match=r"inside an accumulation window \(loss_scale_micro_step=1\).* has no "
        r"accumulation \(accumulation_steps=1\)",
    ):
        target(*(Tensor(a) for a in BATCHES[3]))
    assert changed_since(before, target, snapshot) == []


def _write_inf_with_set_data(cell):
    cell.scale_sense.set_data(Tensor(np.float32(np.inf)))


def _write_inf_with_load_param_into_net(cell):
    ms.load_param_into_net(cell, {"scale_sense": Parameter(Tensor(np.float32(np.inf)), name="scale_sense")})


@pytest.mark.parametrize(
    "write", [_write_inf_with_set_data, _write_inf_with_load_param_into_net], ids=["set_data", "load_param_into_net"]
)
@pytest.mark.parametrize(
    "scale_sense",
    [lambda: Tensor(np.float32(8.0)), lambda: FixedLossScaleUpdateCell(8.0)],
    ids=["Tensor", "fixed update cell"],
)
@pytest.mark.slow
def test_a_non_finite_fixed_scale_written_into_a_running_cell_is_refused(scale_sense, write):
    """Every step would be skipped from then on (the checks before the first step do not run again): the step
    that would skip raises instead, having applied nothing."""
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), scale_sense())
    assert _run(cell, BATCHES[:1]) == ([False], [8.0])
    write(cell)
    before = training_state(cell)
    with pytest.raises(ValueError, match="the loss scale is not finite .*every step would be skipped"):
        _run(cell, BATCHES[1:2])
    assert changed_since(before, cell) == []


@pytest.mark.parametrize(
    "write", [_write_inf_with_set_data, _write_inf_with_load_param_into_net], ids=["set_data", "load_param_into_net"]
)
def test_a_non_finite_dynamic_scale_written_into_a_running_cell_is_brought_back_by_its_rule(write):
    """The rule backs off from inf as from the largest float32 scale, skipping one step."""
    cell = _dynamic_cell()
    _run(cell, BATCHES[:1])
    write(cell)
    half = float(np.finfo(np.float32).max) / 2
    assert _run(cell, BATCHES[1:3]) == ([True, False], [half, half])


# ---- decisions -------------------------------------------------------------------------------------


class HugeGradient(nn.Cell):
    """``loss = w * x``: the gradient is ``x``, 3e38 (finite in float32); two of them sum to inf."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(1, np.float32)), name="w")

    def construct(self, x):
        return ops.reduce_sum(self.w * x)


def test_finite_micro_batch_gradients_whose_sum_is_inf_skip_the_window():
    net = HugeGradient()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 1e-40), Tensor(np.float32(1.0)), accumulation_steps=2
    )
    x = Tensor(np.array([3e38], np.float32))
    first = cell(x)
    second = cell(x)
    assert not bool(first[1].asnumpy()) and bool(second[1].asnumpy())
    assert net.w.asnumpy().tolist() == [1.0] and cell.overflow_counters()["skipped_steps"] == 1


def test_an_overridden_get_overflow_status_is_honoured_under_accumulation():
    class AlwaysOverflow(TrainOneStepWithLossScaleCell):
        def get_overflow_status(self, status, compute_output):
            return Tensor(True)

    net = regression_net()
    cell = AlwaysOverflow(net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(8.0)), accumulation_steps=2)
    before = training_state(net)
    flags, _ = _run(cell, BATCHES[:4])
    assert flags == [False, True, False, True] and cell.overflow_counters()["skipped_steps"] == 2
    assert changed_since(before, net) == []


class ZeroSizeParameter(nn.Cell):
    """A network with a trainable Parameter of zero elements (an empty prefix), as some adapters have."""

    def __init__(self):
        super().__init__()
        self.body = nn.Dense(6, 3)
        self.empty = Parameter(Tensor(np.zeros((0, 3), np.float32)), name="empty")
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        logits = ops.concat((self.empty, self.body(x)), 0)
        return self.loss(logits, y)


@pytest.mark.parametrize("clip", [None, 10.0], ids=["check", "clipping_norm"])
def test_a_zero_size_parameter_does_not_fake_overflows(clip):
    """MindSpore's CPU ReduceSum of an empty tensor returns uninitialised memory: clean steps were flagged and
    the scale fell forever (in the overflow check, and in the clipping norm that decides instead)."""
    net = ZeroSizeParameter()
    cell = TrainOneStepWithLossScaleCell(
        net,
        PlainSGD(0.01, net.trainable_params()),
        DynamicLossScaleManager(2**10, scale_window=2).get_update_cell(),
        clip_global_norm=clip,
    )
    flags, scales = _run(cell, BATCHES * 2)
    assert flags == [False] * 16 and scales[-1] == 2.0**18


class Bfloat16Loss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.Dense(6, 3)
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return ops.cast(self.loss(self.body(x), y), mstype.bfloat16)


def test_a_bfloat16_loss_trains_like_mindsporess_plain_cell():
    ms.set_seed(1)
    ours, theirs = Bfloat16Loss(), Bfloat16Loss()
    ms.load_param_into_net(theirs, {p.name: Parameter(p.data.copy(), name=p.name) for p in ours.get_parameters()})
    cell = TrainOneStepWithLossScaleCell(ours, nn.SGD(ours.trainable_params(), 0.1), Tensor(np.float32(1.0)))
    plain = nn.TrainOneStepCell(theirs, nn.SGD(theirs.trainable_params(), 0.1))
    for x, y in BATCHES[:3]:
        assert not bool(cell(Tensor(x), Tensor(y))[1].asnumpy())
        plain(Tensor(x), Tensor(y))
    _same_weights(ours, theirs)


def test_forensics_name_a_non_finite_bfloat16_loss():
    """The forensics test the loss in float32: MindSpore's CPU isfinite has no bfloat16 kernel (testing the
    bfloat16 loss itself failed to compile: "Kernel select failed")."""
    net = Bfloat16Loss()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(1.0)), debug_overflow=True
    )
    x, y = BATCHES[0]
    x = x.copy()
    x[0, 0] = np.inf
    assert bool(cell(Tensor(x), Tensor(y))[1].asnumpy())
    assert cell.overflow_reports == [{"step": 1, "loss_nonfinite": True, "parameters": ["body.weight", "body.bias"]}]


def _float64_steps(front_end, net, learning_rate):
    """A step function ``(x, y) -> None`` training ``net`` with ``front_end`` at a fixed scale of 1024."""
    optimizer = PlainSGD(learning_rate, net.trainable_params())
    if front_end == "train cell":
        return TrainOneStepWithLossScaleCell(net, optimizer, Tensor(np.float32(1024.0)))
    if front_end == "LossScaleOptimizer":
        wrapper = LossScaleOptimizer(optimizer, dynamic=False, initial_scale=1024.0)

        def minimize(x, y):
            def loss():
                return net(x, y)

            wrapper.minimize(loss)

        return minimize
    scaler = GradScaler(init_scale=1024.0)

    def forward(x, y):
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(x, y):
        scaler.step(optimizer, grad_fn(x, y)[1])
        scaler.update()

    return step


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "loss, dtype, expected",
    [
        (np.float16(60000.0), mstype.float32, 60000.0 * 2.0**16),  # beyond float16's range once scaled
        (ms.Tensor(1.5, mstype.bfloat16), mstype.float32, 1.5 * 2.0**16),
        (np.float32(1.5), mstype.float32, 1.5 * 2.0**16),
        (np.float64(1e300), mstype.float64, 1e300 * 2.0**16),  # beyond float32's range once scaled
    ],
    ids=["float16", "bfloat16", "float32", "float64"],
)
def test_the_scaled_loss_is_promoted_to_at_least_float32(loss, dtype, expected, compiled):
    """What scale() returns for each loss dtype: at least float32, so a scaled float16 loss does not overflow, and
    float64 for a float64 loss. (MindSpore's own type promotion gives the same on 2.7.1 and 2.10, measured: the
    explicit casts only make it independent of that.)"""
    core = LossScaler(2.0**16, name=f"promoted_{compiled}")
    loss = loss if isinstance(loss, Tensor) else Tensor(loss)
    scaled = (ms.jit(core.scale) if compiled else core.scale)(loss)
    assert scaled.dtype == dtype and float(scaled.astype(mstype.float64).asnumpy()) == expected


@pytest.mark.parametrize(
    "losses, finite",
    [
        ((Tensor(1.0), Tensor(2.0)), True),
        ((Tensor(np.nan), Tensor(2.0)), False),
        ([Tensor(1.0), (Tensor(2.0), Tensor(-np.inf))], False),
        ([(Tensor(np.inf),), Tensor(2.0)], False),
    ],
    ids=["finite", "first", "nested_last", "nested_first"],
)
def test_a_non_finite_loss_anywhere_in_a_nested_tuple_counts(losses, finite):
    """loss_flag over several losses sums every one's term (keeping only the last passed the suite)."""
    flag = LossScaler(8.0, name="nested_loss_flag").loss_flag(losses)
    assert np.isfinite(float(flag.asnumpy())) == finite


@pytest.mark.parametrize(
    "rule, mutable_rule, switch, expected",
    [
        (8.0, False, None, False),
        (Tensor(np.float32(8.0)), False, None, False),
        (FixedLossScaleUpdateCell(8.0), False, None, False),
        (nn.FixedLossScaleUpdateCell(8.0), False, None, False),
        (nn.DynamicLossScaleUpdateCell(8.0, 2, 3), False, None, True),
        (LossScalePolicy(init_scale=8.0), False, None, True),
        (LossScalePolicy(init_scale=8.0), True, None, True),
        (LossScalePolicy(init_scale=8.0), True, False, False),
        (LossScalePolicy(init_scale=8.0), True, True, True),
    ],
    ids=[
        "number",
        "tensor",
        "fixed_cell",
        "mindspore_fixed_cell",
        "mindspore_dynamic_cell",
        "policy",
        "mutable",
        "switched_fixed",
        "switched_back",
    ],
)
def test_the_core_reports_whether_its_scale_is_dynamic(rule, mutable_rule, switch, expected):
    """The host property ``dynamic`` and the graph read ``dynamic_flag()`` agree for every kind of rule (a
    dynamic_flag that always read the mutable rule's Parameter survived the other tests: only the GradScaler, whose
    rule is always mutable, reads it)."""
    core = LossScaler(
        rule, name=f"dynamic_flag_{type(rule).__name__}_{mutable_rule}_{switch}", mutable_rule=mutable_rule
    )
    if switch is not None:
        core.set_rule(dynamic=False)
        if switch:
            core.set_rule(dynamic=True)
    assert core.dynamic == expected
    assert bool(core.dynamic_flag().asnumpy()) == expected


@pytest.mark.parametrize("rule", [8.0, LossScalePolicy(init_scale=8.0)], ids=["fixed", "dynamic"])
def test_set_rule_needs_a_mutable_rule(rule):
    """A core built without mutable_rule has no Parameters for a rule change: set_rule() says so and changes
    nothing (without the check: an AttributeError from the update cell, or None's)."""
    core = LossScaler(rule, name=f"immutable_rule_{type(rule).__name__}")
    dynamic, state = core.dynamic, core.state_dict()
    for change in (dict(dynamic=not dynamic), dict(policy=LossScalePolicy(init_scale=4.0)), dict(state=state)):
        with pytest.raises(RuntimeError, match=r"set_rule\(\) needs a LossScaler built with mutable_rule=True"):
            core.set_rule(**change)
    assert (core.dynamic, core.state_dict()) == (dynamic, state)


@pytest.mark.parametrize("front_end", ["train cell", "GradScaler", "LossScaleOptimizer"])
@pytest.mark.parametrize("magnitude", [1.0, 1e20], ids=["precision", "range beyond float32"])
@pytest.mark.slow
def test_float64_gradients_keep_their_precision_and_range(front_end, magnitude):
    """Unscaling went through float32: float64 gradients lost their precision (weights 8e-9 off the control),
    and finite float64 gradients beyond float32's range became inf, so every step was skipped."""
    rng = np.random.RandomState(5)
    batches = [(Tensor(rng.randn(4, 6) * magnitude), Tensor(rng.randn(4, 3))) for _ in range(3)]
    ours, theirs = Float64Regression(), Float64Regression()
    step = _float64_steps(front_end, ours, 1e-3)
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    initial = theirs.w.asnumpy().copy()
    for x, y in batches:
        step(x, y)
        control(x, y)
    assert np.isfinite(theirs.w.asnumpy()).all() and not np.array_equal(theirs.w.asnumpy(), initial)
    # Scaling by 1024 and unscaling by 1/1024 are exact in float64: the same weights, bit for bit.
    _same_weights(ours, theirs)


def test_float64_gradients_keep_their_precision_through_clipping():
    """Clipping multiplied through float32 (even by a factor of 1), rounding float64 gradients to float32
    precision."""
    rng = np.random.RandomState(5)
    ours, theirs = Float64Regression(), Float64Regression()
    step = TrainOneStepWithLossScaleCell(
        ours, PlainSGD(1e-3, ours.trainable_params()), Tensor(np.float32(1024.0)), clip_global_norm=1e30
    )
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    for _ in range(3):
        x, y = Tensor(rng.randn(4, 6)), Tensor(rng.randn(4, 3))
        assert not bool(step(x, y)[1].asnumpy())
        control(x, y)
    _same_weights(ours, theirs)


@pytest.mark.parametrize("steps", [2, 3])
def test_float64_gradients_keep_their_precision_through_accumulation(steps):
    """float32 accumulators rounded float64 gradients to float32 precision. The control trains on the window's
    micro-batches at once: the same mean gradient up to float64 rounding. With 3 micro-batches the mean must divide
    in float64 too (float32's 1/3 is 1e-8 off: weights 1e-10 off the control, measured)."""
    rng = np.random.RandomState(5)
    ours, theirs = Float64Regression(), Float64Regression()
    step = TrainOneStepWithLossScaleCell(
        ours, PlainSGD(1e-3, ours.trainable_params()), Tensor(np.float32(1024.0)), accumulation_steps=steps
    )
    control = nn.TrainOneStepCell(theirs, PlainSGD(1e-3, theirs.trainable_params()))
    assert step.accumulation.accumulators[0].dtype == mstype.float64
    for _ in range(3):
        x, y = rng.randn(4 * steps, 6), rng.randn(4 * steps, 3)
        for micro in range(steps):
            step(Tensor(x[4 * micro : 4 * micro + 4]), Tensor(y[4 * micro : 4 * micro + 4]))
        control(Tensor(x), Tensor(y))
    np.testing.assert_allclose(ours.w.asnumpy(), theirs.w.asnumpy(), rtol=1e-13, atol=0)


def test_raise_policy_reads_the_scale_after_a_resume(tmp_path):
    """The host copy of the scale was taken at construction: a cell built at its minimum scale that resumed at
    2**15 raised PersistentOverflowError on its first overflow, naming the wrong scale."""
    source = _dynamic_cell()
    source.set_sense_scale(Tensor(np.float32(2.0**15)))
    saved = _checkpoint(source, tmp_path / "s.ckpt")
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(
        net,
        nn.SGD(net.trainable_params(), 0.05),
        DynamicLossScaleManager(1.0, scale_window=2).get_update_cell(),
        overflow_policy="raise",
    )
    ms.load_param_into_net(cell, saved)
    flags, scales = _run(cell, BATCHES[:2], inject={0})
    assert flags == [True, False] and scales == [2.0**14, 2.0**14]
    cell.set_sense_scale(Tensor(np.float32(1.0)))
    with pytest.raises(PersistentOverflowError, match="already at its minimum 1; loss scale 1,"):
        _run(cell, BATCHES[:1], inject={0})


def test_set_sense_scale_keeps_to_the_rule():
    cell = _dynamic_cell(max_loss_scale=2.0**14)
    with pytest.raises(ValueError, match=r"within the update cell's \[min_loss_scale, max_loss_scale\]"):
        cell.set_sense_scale(Tensor(np.float32(2.0**20)))
    net = regression_net()
    fixed = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), FixedLossScaleUpdateCell(512.0))
    with pytest.raises(ValueError, match="FixedLossScaleUpdateCell, which fixes it at 512.0"):
        fixed.set_sense_scale(Tensor(np.float32(1024.0)))
    mindspores = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), nn.FixedLossScaleUpdateCell(256.0)
    )  # MindSpore's own fixed cell
    with pytest.raises(ValueError, match="FixedLossScaleUpdateCell, which fixes it at 256.0"):
        mindspores.set_sense_scale(Tensor(np.float32(1024.0)))
    assert cell.get_loss_scale() == 4096.0 and fixed.get_loss_scale() == 512.0 and mindspores.get_loss_scale() == 256.0


def test_the_float32_floor_is_a_valid_scale_for_set_sense_scale_and_the_state_check():
    cell = _dynamic_cell(min_loss_scale=0.7)  # 0.7 is 0.69999999 in float32, the scale the rule floors at
    cell.set_sense_scale(Tensor(np.float32(0.7)))
    cell.check_state()
    assert cell.get_loss_scale() == float(np.float32(0.7))
    with pytest.raises(ValueError, match="min_loss_scale"):
        cell.set_sense_scale(Tensor(np.nextafter(np.float32(0.7), np.float32(0))))


@pytest.mark.parametrize("options", [{}, {"clip_global_norm": 1e6}], ids=["no clipping", "norm from clipping"])
def test_extra_outputs_give_the_learning_rate_and_the_global_norm(options):
    net = regression_net()
    schedule = nn.piecewise_constant_lr([2, 4], [0.1, 0.01])
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), schedule), Tensor(np.float32(256.0)), extra_outputs=True, **options
    )
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    rates = []
    for x, y in BATCHES[:3]:
        _, grads = grad_fn(Tensor(x), Tensor(y))
        expected = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
        outputs = cell(Tensor(x), Tensor(y))
        assert len(outputs) == 5
        rates.append(round(float(outputs[3].asnumpy()), 6))
        assert float(outputs[4].asnumpy()) == pytest.approx(expected, rel=1e-5)
    assert rates == [0.1, 0.1, 0.01]


def test_extra_outputs_with_accumulation_report_each_micro_batch_and_the_window_mean():
    net = regression_net()
    cell = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(256.0)), extra_outputs=True, accumulation_steps=2
    )
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    (x0, y0), (x1, y1) = BATCHES[:2]
    first = [g.asnumpy().astype(np.float64) for g in grad_fn(Tensor(x0), Tensor(y0))[1]]
    second = [g.asnumpy().astype(np.float64) for g in grad_fn(Tensor(x1), Tensor(y1))[1]]
    norm = lambda grads: np.sqrt(sum(float((g**2).sum()) for g in grads))  # noqa: E731
    micro, last = cell(Tensor(x0), Tensor(y0)), cell(Tensor(x1), Tensor(y1))
    assert float(micro[4].asnumpy()) == pytest.approx(norm(first), rel=1e-5)  # this micro-batch's gradients
    assert float(last[4].asnumpy()) == pytest.approx(norm([(a + b) / 2 for a, b in zip(first, second)]), rel=1e-5)
    assert [round(float(outputs[3].asnumpy()), 6) for outputs in (micro, last)] == [0.1, 0.1]


@pytest.mark.parametrize(
    "per_micro_batch, inject, expected, drop",
    [
        (False, (), 2, True),
        (True, (), 8, True),
        (False, (5,), 1, True),
        (True, (5,), 8, True),  # the second window skipped (an inf in its second micro-batch)
        (False, (5,), 2, False),
        (True, (5,), 8, False),  # drop_overflow_update=False: that window is applied
    ],
    ids=[
        "per_step",
        "per_micro_batch",
        "per_step_skipped_window",
        "per_micro_batch_skipped_window",
        "per_step_applied_overflow",
        "per_micro_batch_applied_overflow",
    ],
)
def test_lr_schedule_advances_per_optimizer_step_or_per_micro_batch(per_micro_batch, inject, expected, drop):
    """By default global_step counts applied optimizer steps; with lr_per_micro_batch every call, in a skipped
    window too (docs/training.md), and once only in an overflowing window that is applied (the optimizer's own
    count)."""
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.01)
    cell = TrainOneStepWithLossScaleCell(
        net,
        optimizer,
        Tensor(np.float32(64.0)),
        accumulation_steps=4,
        lr_per_micro_batch=per_micro_batch,
        drop_overflow_update=drop,
    )
    overflows = _run(cell, BATCHES, inject)[0]
    assert overflows == [False] * 7 + [bool(inject)]
    assert int(optimizer.global_step.asnumpy().reshape(-1)[0]) == expected


# ---- parallel modes ----------------------------------------------------------------------------------


class RemoteRankFlag(nn.Cell):
    """Stands in for the flag all-reduce: adds the flag another rank would contribute (held in a Parameter: a
    constant nan added inside a compiled graph gave 0 here, measured on MindSpore 2.10 CPU)."""

    def __init__(self, remote):
        super().__init__()
        self.remote = Parameter(Tensor(np.float32(remote)), name="remote_rank_flag", requires_grad=False)

    def construct(self, flag):
        return flag + self.remote


@contextlib.contextmanager
def _parallel_mode(mode):
    """MindSpore's auto-parallel context with ``parallel_mode=mode`` inside the block, reset after it."""
    context.set_auto_parallel_context(parallel_mode=mode)
    try:
        yield
    finally:
        context.reset_auto_parallel_context()


@pytest.mark.parametrize(
    "mode", ["stand_alone", "data_parallel", "hybrid_parallel", "semi_auto_parallel", "auto_parallel"]
)
def test_every_parallel_mode_but_stand_alone_all_reduces_the_flag(mode):
    """As MindSpore's own cell: the decision is all-reduced in every mode but stand-alone, so an overflow on another
    rank skips this one too. (Semi-auto and auto parallel do not run on CPU: the cell is built in the mode, then
    run stand-alone with a stand-in for the collective.)"""
    with _parallel_mode(mode):
        net = regression_net()
        cell = _dynamic_cell(net)
    distributed = mode != "stand_alone"
    assert cell.loss_scaler.is_distributed == distributed
    if distributed:
        cell.loss_scaler.allreduce = RemoteRankFlag(np.nan)
    cell.grad_reducer = ops.identity
    before = training_state(net)
    flags, _ = _run(cell, BATCHES[:1])
    assert flags == [distributed]
    assert (changed_since(before, net) == []) == distributed  # skipped: nothing changed


def _built_in_data_parallel(build):
    """``build()`` in data-parallel mode (its all-reduce is then part of what it compiles), the mode reset after."""
    with _parallel_mode("data_parallel"):
        return build()


# Per iteration of the GradScaler test below: (call unscale_, the call that hears of another rank's overflow).
_REMOTE_OVERFLOW_AT = [(True, "unscale_"), (True, "step"), (False, "step"), (False, "update"), (True, None)]


@pytest.mark.slow
def test_each_grad_scaler_call_all_reduces_its_decision_in_data_parallel():
    """docs/distributed.md: unscale_, step and update each all-reduce one scalar decision. Called from Python each
    is a graph of its own, so the stand-in can report another rank's overflow to one call at a time while this
    rank's gradients are finite: an overflow heard by unscale_ or by step (after unscale_ or not) skips the step
    and backs off; heard by update only, the step was applied and the scale still backs off, as on that rank."""
    net = regression_net()
    optimizer = nn.SGD(net.trainable_params(), 0.05)
    scaler = _built_in_data_parallel(lambda: GradScaler("cpu", init_scale=1024.0))
    remote = RemoteRankFlag(0.0)
    scaler._core.allreduce = remote

    def scaled_loss(x, y):
        return scaler.scale(net(x, y))

    grad_fn = ms.value_and_grad(scaled_loss, None, optimizer.parameters)

    def heard_by(call, this, result):
        remote.remote.set_data(Tensor(np.float32(np.nan if call == this else 0.0)))
        return result()

    skips, scales, moved = [], [], []
    for (x, y), (unscale, this) in zip(BATCHES, _REMOTE_OVERFLOW_AT):
        before = training_state(net)
        grads = grad_fn(Tensor(x), Tensor(y))[1]
        if unscale:
            grads = heard_by("unscale_", this, lambda g=grads: scaler.unscale_(g))
        skips.append(bool(heard_by("step", this, lambda g=grads: scaler.step(optimizer, g)).asnumpy()))
        heard_by("update", this, scaler.update)
        scales.append(scaler.get_scale())
        moved.append(changed_since(before, net) != [])
    assert skips == [True, True, True, False, False]
    assert moved == [False, False, False, True, True]
    assert scales == [512.0, 256.0, 128.0, 64.0, 64.0]


@pytest.mark.parametrize("remote", [0.0, np.nan], ids=["clean", "overflow_on_another_rank"])
@pytest.mark.parametrize("minimize", [False, True], ids=["apply_gradients", "minimize"])
def test_loss_scale_optimizer_skips_when_another_rank_overflowed_in_data_parallel(remote, minimize):
    """The LossScaleOptimizer's decision is all-reduced too (docs/distributed.md): finite gradients here and an
    overflow on another rank skip the step and back off. ``minimize`` reduces its gradients itself; the stand-in
    for that reducer passes them through."""
    net = regression_net()
    optimizer = _built_in_data_parallel(
        lambda: LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), initial_scale=1024.0)
    )
    optimizer._core.allreduce = RemoteRankFlag(remote)
    optimizer._grad_reducer = ops.identity
    x, y = (Tensor(a) for a in BATCHES[0])

    def loss():
        return net(x, y)

    def scaled_loss():
        return optimizer.get_scaled_loss(loss())

    before = training_state(net)
    if minimize:
        optimizer.minimize(loss)
    else:
        grads = ms.value_and_grad(scaled_loss, None, optimizer.parameters)()[1]
        optimizer.apply_gradients(optimizer.get_unscaled_gradients(grads))
    overflow = bool(np.isnan(remote))
    assert (changed_since(before, net) == []) == overflow
    assert float(optimizer.loss_scale.asnumpy()) == (512.0 if overflow else 1024.0)


@pytest.mark.slow
def test_built_before_the_parallel_mode_was_set_is_refused_when_compiled_in_it():
    """Built in stand-alone mode and compiled after set_auto_parallel_context(data_parallel), each rank decided its
    overflow alone, and the train cell and LossScaleOptimizer.minimize did not reduce the gradients: under msrun
    the two ranks' weights diverged without an error (measured; MindSpore's own TrainOneStepCell does the same).
    Now each is refused while compiling, before anything changes; back in stand-alone mode the same objects
    train."""
    net = regression_net()
    cell = _dynamic_cell(net)
    optimizer = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.05), initial_scale=1024.0)
    scaler, torch_optimizer = GradScaler("cpu", init_scale=1024.0), nn.SGD(net.trainable_params(), 0.05)
    x, y = (Tensor(a) for a in BATCHES[0])

    def loss():
        return net(x, y)

    def scaled_loss():
        return scaler.scale(loss())

    grad_fn = ms.value_and_grad(scaled_loss, None, torch_optimizer.parameters)

    def torch_step():
        skipped = scaler.step(torch_optimizer, grad_fn()[1])
        scaler.update()
        return skipped

    steps = {
        "train cell": lambda: cell(x, y)[1],
        "minimize": lambda: optimizer.minimize(loss),
        "GradScaler": torch_step,
    }
    before = training_state(net)
    with _parallel_mode("data_parallel"):
        for name, step in steps.items():
            with pytest.raises(
                RuntimeError,
                match="built in stand-alone mode but is compiled with "
                "parallel_mode='data_parallel'.*after mindspore.set_auto_parallel",
            ):
                step()
            assert changed_since(before, net) == [], name
    assert [bool(step().asnumpy()) for step in steps.values()] == [False] * 3
    scales = (cell.get_loss_scale(), float(optimizer.loss_scale.asnumpy()), scaler.get_scale())
    assert scales == (2.0**12, 1024.0, 1024.0)
    assert changed_since(before, net) != []


def test_pipeline_parallel_is_refused_with_what_to_use():
    net = regression_net()
    context.set_auto_parallel_context(pipeline_stages=2)
    try:
        with pytest.raises(ValueError, match="pipeline parallel .* needs MindSpore's pipeline train cell"):
            build_train_network(
                net, nn.SGD(net.trainable_params(), 0.1), level="O0", loss_scale_manager=DynamicLossScaleManager()
            )
    finally:
        context.reset_auto_parallel_context()


# ---- Model and build_train_network -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"boost_level": "O1", "clip_global_norm": 1.0}, "clip_global_norm would be ignored"),
        (
            {"boost_level": "O2", "accumulation_steps": 2, "overflow_policy": "warn"},
            "accumulation_steps, overflow_policy",
        ),
        ({"boost_level": "O1", "loss_scale_manager": DynamicLossScaleManager()}, "does not run on CPU"),
        ({"boost_level": "O3"}, "'boost_level' must be one of"),
    ],
)
def test_boost_level_refuses_what_it_would_drop(kwargs, pattern):
    net = nn.Dense(4, 2)
    with pytest.raises(ValueError, match=pattern):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), **kwargs)
    with pytest.raises(ValueError, match=pattern):
        build_train_network(net, nn.SGD(net.trainable_params(), 0.1), nn.MSELoss(), **kwargs)


def test_boost_level_with_a_manager_that_has_no_update_cell_runs_mindspores_boost_cell_on_cpu():
    """Only an update cell keeps MindSpore's boost cell off CPU: FixedLossScaleManager(S, False) has none (the
    optimizer's loss_scale=S divides), and MindSpore's BoostTrainOneStepCell trains with it here."""
    net = nn.Dense(4, 2)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=128.0)
    cell = build_train_network(
        net,
        optimizer,
        nn.MSELoss(),
        boost_level="O1",
        loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=False),
    )
    assert type(cell).__name__ == "BoostTrainOneStepCell"
    before = net.weight.asnumpy().copy()
    loss = cell(Tensor(np.ones((3, 4), np.float32)), Tensor(np.zeros((3, 2), np.float32)))
    assert np.isfinite(loss.asnumpy()) and not np.array_equal(net.weight.asnumpy(), before)


def test_model_with_train_cell_options_alone_trains_with_our_cell_at_scale_one():
    """No manager at amp level O0: MindSpore's Model would build its TrainOneStepCell and drop the options; ours
    builds the train cell with them, at a fixed scale of 1 (as build_train_network does)."""
    net = nn.Dense(4, 2)
    cell = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), clip_global_norm=1.0).train_network
    assert type(cell) is TrainOneStepWithLossScaleCell
    assert (cell.get_loss_scale(), cell.clip_global_norm) == (1.0, 1.0)


def test_a_network_with_several_outputs_is_refused_clearly():
    class TwoOutputs(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(6, 3)

        def construct(self, x, y):
            out = self.dense(x)
            return out.mean(), out.sum()

    net = TwoOutputs()
    cell = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(8.0)))
    x, y = BATCHES[0]
    with pytest.raises(TypeError, match="the network returned a tuple: a train cell needs .* one Tensor"):
        cell(Tensor(x), Tensor(y))


# ---- a loss scaled outside the differentiated function -------------------------------------------------------------
# Each front-end's scaling call on a fresh object: (name, build(network) -> scale(loss) function).
_SCALING_CALLS = [
    ("GradScaler, PyTorch's spelling", lambda net: GradScaler("cpu", init_scale=8.0).scale),
    ("GradScaler, Paddle's spelling", lambda net: GradScaler(init_loss_scaling=8.0).scale),
    ("GradScaler, a tuple of losses", lambda net: _first_of_tuple(GradScaler("cpu", init_scale=8.0).scale)),
    (
        "LossScaleOptimizer",
        lambda net: LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0).get_scaled_loss,
    ),
    (
        "LossScaleOptimizer, fixed",
        lambda net: (
            LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), dynamic=False, initial_scale=8.0).get_scaled_loss
        ),
    ),
    (
        "LossScaleOptimizer, a callable",
        lambda net: _called(LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.1), initial_scale=8.0).get_scaled_loss),
    ),
    ("LossScaler (the core)", lambda net: LossScaler(LossScalePolicy(init_scale=8.0), name="outside_core").scale),
]


# Named functions, not lambdas: MindSpore's parser needs a lambda on a line of its own.
def _first_of_tuple(scale):
    def first(loss):
        return scale((loss, loss * 0.0))[0]

    return first


def _called(get_scaled_loss):
    def call(loss):
        def compute():
            return loss

        return get_scaled_loss(compute)()

    return call


def _unscaled(loss):
    return loss


@contextlib.contextmanager
def _caught_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


@pytest.mark.parametrize("name, build", _SCALING_CALLS, ids=[name for name, _ in _SCALING_CALLS])
def test_a_loss_scaled_outside_the_differentiated_function_warns_at_the_callers_line(name, build):
    """PyTorch's habit ``scaler.scale(loss)`` after the gradients were taken: the scaled loss carries no gradients,
    and the step would apply the unscaled loss's gradients divided by S, S times too small without any error
    (measured before the warning: a weight moved by 1e-4 instead of 0.1). Each front-end and the core warn, once,
    pointing at the caller's line; the value is still the scaled loss."""
    net = nn.Dense(2, 1)
    scale = build(net)
    with _caught_warnings() as caught:
        scaled = scale(Tensor(np.float32(0.5)))
    assert float(scaled.asnumpy()) == 4.0
    assert [(w.category, w.filename) for w in caught] == [(UserWarning, __file__)]
    assert "outside a function being differentiated" in str(caught[0].message)


@contextlib.contextmanager
def _mode_of(how):
    """PyNative mode for ``pynative`` (the forward pass then runs from Python), else graph mode (the tests' own)."""
    if how == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def _gradients_with(scale, net, how):
    """The gradients of ``scale(loss)`` of ``net`` taken inside the differentiated function: called from Python
    (in PyNative mode for ``pynative``, in graph mode for ``graph``) or in a compiled step (``jit``)."""
    x = Tensor(np.array([[1.0, 2.0]], np.float32))

    def forward(x):
        return scale(net(x).sum())

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())

    def step(x):
        return grad_fn(x)[1]

    return (ms.jit(step) if how == "jit" else step)(x)


@pytest.mark.parametrize("how", ["pynative", "graph", "jit"])
@pytest.mark.parametrize("name, build", _SCALING_CALLS, ids=[name for name, _ in _SCALING_CALLS])
def test_a_loss_scaled_inside_the_differentiated_function_does_not_warn(name, build, how):
    """The documented place, in each way of calling it: no warning, and gradients S times the unscaled ones."""
    with _mode_of(how), _caught_warnings() as caught:
        net = nn.Dense(2, 1, weight_init="ones", bias_init="zeros")
        scale = build(net)
        grads = _gradients_with(scale, net, how)
        control = _gradients_with(_unscaled, net, how)
    assert [str(w.message) for w in caught if "differentiated" in str(w.message)] == []
    for scaled, unscaled in zip(grads, control):
        np.testing.assert_array_equal(scaled.asnumpy(), 8.0 * unscaled.asnumpy())


def test_a_disabled_scaler_does_not_warn_outside_the_differentiated_function():
    """A disabled scaler returns the loss as it is and ``step`` applies the gradients as they are: nothing to warn
    about."""
    with _caught_warnings() as caught:
        loss = GradScaler("cpu", enabled=False).scale(Tensor(np.float32(0.5)))
    assert float(loss.asnumpy()) == 0.5 and caught == []


def _train_cell_parts(**options):
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.02, 0.9)
    update_cell = options.pop("update_cell", DynamicLossScaleManager(hysteresis=2).get_update_cell())
    return TrainOneStepWithLossScaleCell(net, optimizer, update_cell, **options), (net, optimizer)


def _build_train_network_parts():
    net = regression_net()
    optimizer = nn.Momentum(net.trainable_params(), 0.02, 0.9)
    return build_train_network(net, optimizer, loss_scale_manager=DynamicLossScaleManager()), (net, optimizer)


def _loss_scale_optimizer_parts(**options):
    inner = nn.Adam(regression_net().trainable_params(), 0.01)
    return LossScaleOptimizer(inner, **options), (inner,)


def _grad_scaler_cells(*args):
    scaler = GradScaler(*args)
    return scaler._core, scaler._states


# label: () -> (the Cells that hold lossscale's Parameters, the user's Cells inside them, whose Parameters are not ours)
LOSS_SCALING_OWNERS = {
    "train cell": _train_cell_parts,
    "train cell, every option": lambda: _train_cell_parts(
        update_cell=FixedLossScaleUpdateCell(1024.0), accumulation_steps=2, clip_global_norm=1.0, debug_overflow=True
    ),
    "build_train_network": _build_train_network_parts,
    "LossScaleOptimizer": _loss_scale_optimizer_parts,
    "LossScaleOptimizer, fixed": lambda: _loss_scale_optimizer_parts(dynamic=False, initial_scale=8.0),
    "GradScaler": lambda: (_grad_scaler_cells(), ()),
    "TorchGradScaler": lambda: (_grad_scaler_cells("cpu"), ()),
}


@pytest.mark.parametrize("label", sorted(LOSS_SCALING_OWNERS))
def test_no_loss_scaling_parameter_is_trainable(label):
    """The scale, the counters, the rule and the buffers lossscale adds are state, not weights: a trainable one would
    be in ``trainable_params()``, so an optimizer, ``value_and_grad(..., weights=cell.trainable_params())``, weight
    decay or an EMA built from them would treat it as a weight."""
    owners, users = LOSS_SCALING_OWNERS[label]()
    owners = owners if isinstance(owners, tuple) else (owners,)
    theirs = {id(parameter) for cell in users for parameter in cell.get_parameters()}
    ours = [parameter for cell in owners for parameter in cell.get_parameters() if id(parameter) not in theirs]
    assert ours  # a fixed LossScaleOptimizer holds its scale as a constant, but still its usage flags
    assert [parameter.name for parameter in ours if parameter.requires_grad] == []
