"""Reference networks and the bundled digits data pipeline."""

import inspect
import os
import sys

import numpy as np
import pytest
from mindspore import Tensor

from lossscale_models import MODELS, create_model, load_digits, make_dataset, to_layout, train_test_split


def test_load_digits():
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.float32
    assert 0.0 == images.min() and images.max() == 1.0
    assert labels.dtype == np.int32 and np.bincount(labels).min() >= 170


def test_split_is_deterministic_stratified_and_disjoint():
    images, labels = load_digits()
    (a_x, a_y), (b_x, b_y) = train_test_split(images, labels, seed=0)
    (c_x, _), (d_x, _) = train_test_split(images, labels, seed=0)
    assert np.array_equal(a_x, c_x) and np.array_equal(b_x, d_x)
    assert len(a_y) + len(b_y) == 1797
    shares = np.bincount(b_y) / np.bincount(labels)
    assert np.all(np.abs(shares - 0.2) < 0.02)
    (_, _), (e_x, _) = train_test_split(images, labels, seed=1)
    assert not np.array_equal(b_x, e_x)
    with pytest.raises(ValueError, match="'test_fraction'"):
        train_test_split(images, labels, test_fraction=1.0)


@pytest.mark.parametrize(
    "layout, shape", [("flat", (3, 64)), ("image32", (3, 1, 32, 32)), ("image8", (3, 1, 8, 8)), ("tokens", (3, 8, 8))]
)
def test_layouts(layout, shape):
    images, _ = load_digits()
    out = to_layout(images[:3], layout)
    assert out.shape == shape
    assert np.isclose(out.sum(), images[:3].sum() * (16 if layout == "image32" else 1))


def test_unknown_layout():
    with pytest.raises(ValueError, match="'layout'.*'rgb'"):
        to_layout(np.zeros((1, 8, 8), np.float32), "rgb")


def test_dataset_batches_and_seeded_shuffle():
    images, labels = load_digits()

    def labels_of(seed):
        data = make_dataset(images[:100], labels[:100], 16, "flat", shuffle=True, seed=seed)
        return [batch["label"].tolist() for batch in data.create_dict_iterator(output_numpy=True)]

    first = labels_of(0)
    assert len(first) == 100 // 16 and all(len(b) == 16 for b in first)
    assert first == labels_of(0) and first != labels_of(1)
    with pytest.raises(ValueError, match="'batch_size'"):
        make_dataset(images, labels, 0, "flat")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_give_logits_for_their_layout(name):
    net = create_model(name)
    images, _ = load_digits()
    logits = net(Tensor(to_layout(images[:2], net.input_layout)))
    assert logits.shape == (2, 10) and np.isfinite(logits.asnumpy()).all()


def test_unknown_model():
    with pytest.raises(ValueError, match="'model'.*'vgg'"):
        create_model("vgg")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.slow
def test_models_train_a_step_in_fp16_with_dynamic_scaling(name):
    from mindspore import nn

    from lossscale import DynamicLossScaleManager, build_train_network

    net = create_model(name)
    images, labels = load_digits()
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    step = build_train_network(
        net,
        nn.Adam(net.trainable_params(), 1e-3),
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        level="O3",
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**10),
    )
    loss, overflow, _ = step(Tensor(to_layout(images[:8], net.input_layout)), Tensor(labels[:8]))
    assert np.isfinite(loss.asnumpy()) and not bool(overflow.asnumpy())
    assert any(not np.array_equal(before[p.name], p.asnumpy()) for p in net.trainable_params())


def test_a_model_trains_at_amp_level_o1(tmp_path, monkeypatch):
    """O1 (MindSpore's rewrite) writes a subclass of the network into ./rewritten_network, which imports the
    network's file again: under a module name made from a sys.path entry above it, else as a top-level module
    from its folder. A relative import failed there (ImportError, also with MindSpore's own Model) for a user
    whose sys.path does not hold the repository root; the tests' does, so it is taken away here."""
    from mindspore import nn

    from lossscale import DynamicLossScaleManager, build_train_network

    folder = os.path.dirname(os.path.abspath(inspect.getfile(create_model)))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and not folder.startswith(os.path.abspath(p))])
    monkeypatch.chdir(tmp_path)  # where MindSpore writes the rewritten source
    net = create_model("mlp")
    images, labels = load_digits()
    step = build_train_network(
        net,
        nn.Adam(net.trainable_params(), 1e-3),
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        level="O1",
        loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2**10),
    )
    loss, overflow, _ = step(Tensor(to_layout(images[:8], net.input_layout)), Tensor(labels[:8]))
    assert np.isfinite(loss.asnumpy()) and not bool(overflow.asnumpy())
    assert type(step.network._backbone).__name__.startswith("MLPOpt")
