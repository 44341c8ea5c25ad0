"""Train-cell checkpoints: resumed runs against an uninterrupted run, states of other configurations refused
before the first step, MindSpore's own cell's checkpoints continued, accumulators at window boundaries, and
non-finite scales written into a running cell."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from mindspore.common import dtype as mstype
from nets import changed_since, regression_net, snapshot, training_state
from train_cell_harness import BATCHES, dynamic_cell, run_cell, same_weights, save_cell_checkpoint

from lossscale import (
    AdaptiveLossScaleUpdateCell,
    DynamicLossScaleManager,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    GradScaler,
    LossScaleOptimizer,
    TrainOneStepWithLossScaleCell,
    build_train_network,
)
from lossscale.training.checkpoints import check_cell_state, checkpoint_choice, restore_loss_scale


@pytest.mark.slow
def test_fixed_scale_recipe_keeps_its_scale_when_a_checkpoint_of_another_scale_is_loaded(tmp_path):
    """MindSpore's recipe: FixedLossScaleManager(S, False) and an optimizer with loss_scale=S. A checkpoint of a
    dynamic run (scale_sense = 2**16) must not replace the scale while the optimizer keeps dividing by S."""
    dynamic = dynamic_cell()
    dynamic.set_sense_scale(Tensor(np.float32(2**16)))
    saved = save_cell_checkpoint(dynamic, tmp_path / "dynamic.ckpt")

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
    assert run_cell(resumed, BATCHES) == run_cell(uninterrupted, BATCHES)
    same_weights(resumed, uninterrupted)
    assert resumed.get_loss_scale() == manager.get_loss_scale() == 1024.0 and not_loaded == []


def test_an_inf_scale_in_a_checkpoint_is_refused_before_the_first_step(tmp_path):
    """MindSpore's own cell writes inf once its scale grows past 2**127; such a checkpoint, loaded, would skip every
    step forever, silently, without overflow_policy='raise' firing."""
    source = dynamic_cell()
    source.loss_scaler.scale_value.set_data(Tensor(np.float32(np.inf)))
    saved = save_cell_checkpoint(source, tmp_path / "inf.ckpt")
    target = dynamic_cell()
    ms.load_param_into_net(target, saved)
    before = snapshot(target)
    x, y = BATCHES[0]
    with pytest.raises(ValueError, match=r"'scale_sense' holds inf: a loss scale must be finite and > 0"):
        target(Tensor(x), Tensor(y))
    assert changed_since(before, target, snapshot) == []
    target.load_state_dict({"loss_scale": 1024.0, "good_steps": 0, "hysteresis_left": 1})
    assert run_cell(target, BATCHES[:2]) == ([False, False], [1024.0, 2048.0])


def test_counters_of_another_configuration_are_refused(tmp_path):
    """A hysteresis_left of 3 from a hysteresis-3 run, loaded into a hysteresis-1 cell, would absorb overflows."""
    source = dynamic_cell(hysteresis=3)
    saved = save_cell_checkpoint(source, tmp_path / "h3.ckpt")
    target = dynamic_cell()
    ms.load_param_into_net(target, saved)
    with pytest.raises(
        ValueError,
        match=r"'loss_scale_hysteresis_left' must be an int in \[1, 1\], but got 3\. "
        r"The loaded state does not belong",
    ):
        target.check_state()
    counters = dynamic_cell()
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


def _adaptive_cell():
    net = regression_net()
    update_cell = AdaptiveLossScaleUpdateCell(2.0**10, 2, scale_window=20, max_scale_window=100, min_scale_window=20)
    return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.02), update_cell)


# (cell, Parameter name, value written as a checkpoint load would, message)
FOREIGN_STATES = [
    (
        lambda: dynamic_cell(max_loss_scale=2.0**14),
        "scale_sense",
        np.float32(2.0**15),
        r"'scale_sense' must be a finite number in \[1\.0, 16384\.0\], but got 32768\.0\.",
    ),
    (
        lambda: dynamic_cell(min_loss_scale=4.0),
        "scale_sense",
        np.float32(2.0),
        r"'scale_sense' must be a finite number in \[4\.0, ",
    ),
    (
        dynamic_cell,
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
    (  # a level of a cell with other window bounds
        _adaptive_cell,
        "list_index",
        np.int32(3),
        r"'scale_window' must be the window of level 3, 50, but got 20\.",
    ),
    (
        _adaptive_cell,
        "scale_sense",
        np.float32(0.5),
        r"'scale_sense' must be a finite number in \[1\.0, ",
    ),
]


@pytest.mark.parametrize(
    "make, name, value, message",
    FOREIGN_STATES,
    ids=["above_max", "below_min", "good_steps", "fixed_scale_changed", "micro_step", "window", "adaptive_scale"],
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
    cell = dynamic_cell(max_loss_scale=2.0**20)
    run_cell(cell, BATCHES[:1])
    cell.loss_scaler.scale_value.set_data(Tensor(np.float32(np.inf)))
    flags, scales = run_cell(cell, BATCHES[1:3])
    assert flags == [True, False] and scales == [2.0**19, 2.0**19]


@pytest.mark.slow
def test_weights_only_checkpoint_starts_the_scale_fresh(tmp_path):
    trained = dynamic_cell()
    run_cell(trained, BATCHES[:3], inject={1})
    weights = {
        k: v
        for k, v in save_cell_checkpoint(trained, tmp_path / "all.ckpt").items()
        if not k.startswith(("scale_sense", "loss_scale_"))
    }
    resumed, fresh = dynamic_cell(), dynamic_cell()
    ms.load_param_into_net(resumed, weights)
    ms.load_param_into_net(fresh, weights)
    assert resumed.get_loss_scale() == 4096.0
    assert run_cell(resumed, BATCHES[3:]) == run_cell(fresh, BATCHES[3:])
    same_weights(resumed, fresh)


@pytest.mark.slow
def test_a_checkpoint_loaded_into_the_bare_network_restores_the_scale_with_restore_loss_scale(tmp_path):
    """The usual MindSpore way (load_param_into_net(network, ckpt), then the train cell) silently restarted the
    scale; restore_loss_scale(cell, ckpt) continues exactly as the uninterrupted run."""
    uninterrupted = dynamic_cell()
    run_cell(uninterrupted, BATCHES[:4], inject={1})
    saved = save_cell_checkpoint(uninterrupted, tmp_path / "cell.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = dynamic_cell(net=network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert resumed.get_loss_scale() == 4096.0  # what the bare-network load gives: the initial scale
    names = restore_loss_scale(resumed, saved)
    assert "scale_sense" in names and resumed.get_loss_scale() == uninterrupted.get_loss_scale()
    assert run_cell(resumed, BATCHES[4:], inject={6}) == run_cell(uninterrupted, BATCHES[4:], inject={6})
    same_weights(resumed, uninterrupted)
    with pytest.raises(ValueError, match="holds none of this train cell's loss-scale state"):
        restore_loss_scale(
            dynamic_cell(), {k: v for k, v in saved.items() if not k.startswith("loss_scale_") and k != "scale_sense"}
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
    uninterrupted = dynamic_cell()
    flags, scales = run_cell(uninterrupted, BATCHES, inject={1, 4})
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    for flag in flags[:6]:  # a clean step ends the saved part: the count is 1 of a window of 2
        theirs(Tensor(flag))
    saved = save_cell_checkpoint(theirs, tmp_path / "mindspore_cell.ckpt")
    assert float(saved["scale_sense"].asnumpy()) == scales[5]
    resumed = dynamic_cell()
    assert restore_loss_scale(resumed, saved) == ["loss_scale_good_steps", "scale_sense"]
    assert run_cell(resumed, BATCHES[6:]) == (flags[6:], scales[6:]) and scales[6] == 2 * scales[5]
    longer_window = _MindSporeLossScaleState(2.0**12, 8)  # 3 clean steps: more than a window of 2 allows
    for _ in range(3):
        longer_window(Tensor(False))
    target = dynamic_cell()
    with pytest.raises(ValueError, match="loss_scale_good_steps"):
        restore_loss_scale(target, save_cell_checkpoint(longer_window, tmp_path / "window8.ckpt"))
    assert target.state_dict()["good_steps"] == 0 and target.get_loss_scale() == 2.0**12


@pytest.mark.slow
def test_load_param_into_net_continues_a_checkpoint_of_mindspores_own_cell_as_restore_loss_scale(tmp_path):
    """The same checkpoint loaded the usual MindSpore way, into the train cell: its step counters are received under
    their names and become the clean-step count before the next step (growth came up to a window late), and the
    counters are put back to a fresh cell's, so that a later check does not apply them again."""
    uninterrupted = dynamic_cell()
    flags, scales = run_cell(uninterrupted, BATCHES, inject={1, 4})
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    for flag in flags[:6]:
        theirs(Tensor(flag))
    resumed = dynamic_cell()
    ms.load_param_into_net(resumed, save_cell_checkpoint(theirs, tmp_path / "mindspore_cell.ckpt"))
    assert run_cell(resumed, BATCHES[6:7]) == (flags[6:7], scales[6:7]) and scales[6] == 2 * scales[5]
    resumed.check_state()
    assert run_cell(resumed, BATCHES[7:]) == (flags[7:], scales[7:])
    longer_window = _MindSporeLossScaleState(2.0**12, 8)  # 3 clean steps: more than a window of 2 allows
    for _ in range(3):
        longer_window(Tensor(False))
    target = dynamic_cell()
    ms.load_param_into_net(target, save_cell_checkpoint(longer_window, tmp_path / "window8.ckpt"))
    with pytest.raises(ValueError, match="loss_scale_good_steps"):
        target(*(Tensor(a) for a in BATCHES[0]))
    assert target.state_dict()["good_steps"] == 0 and target.overflow_counters()["steps"] == 0


@pytest.mark.parametrize("ours, expected", [(None, 1), (0, 0)], ids=["MindSpore's only", "both"])
def test_restore_loss_scale_translates_mindspores_counters_only_without_ours(ours, expected, tmp_path):
    """A checkpoint holding our clean-step count as well as MindSpore's step numbers restores ours as saved; the
    translation is for a checkpoint without it (one clean step: MindSpore's counters say 1)."""
    theirs = _MindSporeLossScaleState(2.0**12, 2)
    theirs(Tensor(False))
    saved = save_cell_checkpoint(theirs, tmp_path / "mindspore_cell.ckpt")
    if ours is not None:
        saved["loss_scale_good_steps"] = Parameter(Tensor(np.int32(ours)), name="loss_scale_good_steps")
    resumed = dynamic_cell()
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
    flags, scales = run_cell(uninterrupted, BATCHES[:6], inject={1, 4})
    saved = save_cell_checkpoint(uninterrupted, tmp_path / "ms_update_cell.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = cell(network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert {"current_iterator_step", "last_overflow_iterator_step", "scale_sense"} <= set(
        restore_loss_scale(resumed, saved)
    )
    assert run_cell(resumed, BATCHES[6:]) == run_cell(uninterrupted, BATCHES[6:])
    same_weights(resumed, uninterrupted)


@pytest.mark.slow
def test_state_dict_of_a_cell_with_mindspores_update_cell_keeps_the_clean_steps():
    """With MindSpore's own update cell, state_dict() held the scale only: a resume from it lost the clean steps
    counted so far (growth a window late). It now holds them as good_steps, in our format, and loads them into a
    fresh cell and into one that has run (whose last overflow came after the saved one: MindSpore's cell keeps
    step numbers, so both of them are rewritten); a value beyond the cell's window is refused and changes
    nothing; a scale-only state (0.1.0's) still loads."""
    uninterrupted = _cell_with_mindspores_update_cell()
    run_cell(uninterrupted, BATCHES[:6], inject={1, 4})
    state = uninterrupted.state_dict()
    assert state == {"loss_scale": 2.0**11, "good_steps": 1}
    weights = training_state(uninterrupted)
    resumed = [_cell_with_mindspores_update_cell(), _cell_with_mindspores_update_cell()]
    run_cell(resumed[1], BATCHES[:7], inject={6})
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
    expected = run_cell(uninterrupted, BATCHES[6:])
    assert [run_cell(cell, BATCHES[6:]) for cell in resumed] == [expected, expected]
    target = _cell_with_mindspores_update_cell()
    with pytest.raises(ValueError, match=r"'state_dict\['good_steps'\]' must be an int in \[0, 1\], but got 2"):
        target.load_state_dict({"loss_scale": 512.0, "good_steps": 2})
    assert target.state_dict() == {"loss_scale": 2.0**12, "good_steps": 0}
    with pytest.raises(TypeError, match="'state_dict' must be a dict, but got NoneType"):
        target.load_state_dict(None)
    target.load_state_dict({"loss_scale": 512.0})
    assert target.state_dict() == {"loss_scale": 512.0, "good_steps": 0}


def test_restore_loss_scale_changes_nothing_when_the_state_is_invalid(tmp_path):
    source = dynamic_cell(hysteresis=2)
    saved = save_cell_checkpoint(source, tmp_path / "h2.ckpt")
    target = dynamic_cell()
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
    cell = dynamic_cell()
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
    """Not a train cell, not a dict: a TypeError naming the argument. An entry that is not a number, or a
    fractional, non-finite or out-of-range value for an integer counter: refused before anything is written
    (written as they come, a string fails MindSpore's conversion after the earlier entries, 1.5 truncates to 1 and
    2**32 + 1 wraps to 1)."""
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
    run_cell(uninterrupted, BATCHES[:4])
    path = tmp_path / "boundary.ckpt"
    choose = uninterrupted.checkpoint_choice()
    ms.save_checkpoint(uninterrupted, str(path), choice_func=choose)
    saved = ms.load_checkpoint(str(path))
    assert not [k for k in saved if k.startswith("loss_scale_accumulator.")] and "loss_scale_micro_step" in saved
    resumed = cell()
    not_loaded, _ = ms.load_param_into_net(resumed, saved)
    assert all(name.startswith("loss_scale_accumulator.") for name in not_loaded)
    assert run_cell(resumed, BATCHES[4:]) == run_cell(uninterrupted, BATCHES[4:])
    same_weights(resumed, uninterrupted)
    run_cell(uninterrupted, BATCHES[:1])  # mid-window: the accumulators are kept, also by the function built before
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
    run_cell(uninterrupted, BATCHES[:3])  # one micro-batch into the second window
    saved = save_cell_checkpoint(uninterrupted, tmp_path / "mid.ckpt")
    network = regression_net()
    ms.load_param_into_net(network, saved)
    resumed = _accumulating_cell(network)
    ms.load_param_into_net(resumed.optimizer, saved)
    assert "loss_scale_micro_step" in restore_loss_scale(resumed, saved)
    same_weights(resumed, uninterrupted)
    assert run_cell(resumed, BATCHES[3:], inject={5}) == run_cell(uninterrupted, BATCHES[3:], inject={5})
    same_weights(resumed, uninterrupted)
    without_sums = {k: v for k, v in saved.items() if not k.startswith("loss_scale_accumulator.")}
    no_window = r"inside an accumulation window \(loss_scale_micro_step=1\).* has no accumulation"
    for target, state, error in [
        (dynamic_cell(), saved, no_window + r" \(accumulation_steps=1\)"),
        (dynamic_cell(), {k: v.asnumpy() for k, v in saved.items()}, no_window),  # a dict of arrays too
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
    run_cell(uninterrupted, BATCHES[:3])  # one micro-batch into the second window
    target = dynamic_cell()
    ms.load_param_into_net(target, save_cell_checkpoint(uninterrupted, tmp_path / "mid.ckpt"))
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


# A fixed scale given as a Tensor or a fixed update cell, and what the refusal's message says writes it back.
FIXED_SCALES = {
    "Tensor-set_sense_scale": (lambda: Tensor(np.float32(8.0)), lambda cell: cell.set_sense_scale(Tensor(8.0))),
    "Tensor-load_state_dict": (lambda: Tensor(np.float32(8.0)), lambda cell: cell.load_state_dict({"loss_scale": 8.0})),
    "fixed_update_cell-load_state_dict": (
        lambda: FixedLossScaleUpdateCell(8.0),
        lambda cell: cell.load_state_dict({"loss_scale": 8.0}),
    ),
}


@pytest.mark.parametrize(
    "write", [_write_inf_with_set_data, _write_inf_with_load_param_into_net], ids=["set_data", "load_param_into_net"]
)
@pytest.mark.parametrize("scale_sense", FIXED_SCALES)
@pytest.mark.slow
def test_a_non_finite_fixed_scale_written_into_a_running_cell_is_refused(scale_sense, write):
    """Every step would be skipped from then on (the checks before the first step do not run again): the step
    that would skip raises instead, having applied nothing. Once the scale is written back as the message says,
    the cell trains on as one that never saw the inf."""
    make, remedy = FIXED_SCALES[scale_sense]
    net, control_net = regression_net(), regression_net()
    cell = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), make())
    control = TrainOneStepWithLossScaleCell(control_net, nn.SGD(control_net.trainable_params(), 0.1), make())
    assert run_cell(cell, BATCHES[:1]) == run_cell(control, BATCHES[:1]) == ([False], [8.0])
    write(cell)
    before = training_state(cell)
    with pytest.raises(ValueError, match="the loss scale is not finite .*every step would be skipped"):
        run_cell(cell, BATCHES[1:2])
    assert changed_since(before, cell) == []
    remedy(cell)
    assert run_cell(cell, BATCHES[1:3]) == run_cell(control, BATCHES[1:3]) == ([False, False], [8.0, 8.0])
    assert changed_since(training_state(control), cell) == []


@pytest.mark.parametrize(
    "write", [_write_inf_with_set_data, _write_inf_with_load_param_into_net], ids=["set_data", "load_param_into_net"]
)
def test_a_non_finite_dynamic_scale_written_into_a_running_cell_is_brought_back_by_its_rule(write):
    """The rule backs off from inf as from the largest float32 scale, skipping one step."""
    cell = dynamic_cell()
    run_cell(cell, BATCHES[:1])
    write(cell)
    half = float(np.finfo(np.float32).max) / 2
    assert run_cell(cell, BATCHES[1:3]) == ([True, False], [half, half])
