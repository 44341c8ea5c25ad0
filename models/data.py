"""The bundled handwritten-digits data: loading, a deterministic split, MindSpore pipelines.

Example:
    >>> images, labels = load_digits()
    >>> images.shape, labels.shape, int(labels.max())
    ((1797, 8, 8), (1797,), 9)
"""

import gzip
import os

import numpy as np

DIGITS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")
NUM_CLASSES = 10


def load_digits(path=DIGITS_PATH):
    """Return ``(images, labels)``: float32 images (N, 8, 8) scaled to [0, 1] and int32 labels (N,)."""
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float32)
    images = (table[:, :64] / 16.0).reshape(-1, 8, 8).astype(np.float32)
    return images, table[:, 64].astype(np.int32)


def train_test_split(images, labels, test_fraction=0.2, seed=0):
    """Deterministic stratified split: the same ``seed`` always gives the same partition.

    Example:
        >>> x, y = load_digits()
        >>> (x_train, y_train), (x_test, y_test) = train_test_split(x, y)
        >>> len(y_train), len(y_test)
        (1438, 359)
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"'test_fraction' must be in (0, 1), but got {test_fraction!r}.")
    rng = np.random.RandomState(seed)
    test_index = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        test_index.extend(members[: int(round(len(members) * test_fraction))])
    test_mask = np.zeros(len(labels), bool)
    test_mask[test_index] = True
    return (images[~test_mask], labels[~test_mask]), (images[test_mask], labels[test_mask])


def to_layout(images, layout):
    """Reshape (N, 8, 8) images for a network: ``"flat"`` (N, 64), ``"image32"`` (N, 1, 32, 32),
    ``"image8"`` (N, 1, 8, 8) or ``"tokens"`` (N, 8, 8) (rows as tokens)."""
    if layout == "flat":
        return images.reshape(len(images), -1)
    if layout == "image32":
        return np.repeat(np.repeat(images, 4, axis=1), 4, axis=2)[:, None, :, :]
    if layout == "image8":
        return images[:, None, :, :]
    if layout == "tokens":
        return images
    raise ValueError(f"'layout' must be one of ('flat', 'image32', 'image8', 'tokens'), but got {layout!r}.")


def make_dataset(images, labels, batch_size, layout, shuffle=False, seed=0, drop_remainder=True, shard=None):
    """A MindSpore dataset of ``(data, label)`` batches in the network's layout.

    ``shard=(shard_id, num_shards)`` keeps this rank's share of the samples (data parallel).

    With ``shuffle`` the order changes every epoch but is seeded (``mindspore.dataset.config.set_seed``),
    so two pipelines built with the same arguments yield the same batches.
    """
    import mindspore.dataset as ds

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"'batch_size' must be a positive int, but got {batch_size!r}.")
    data = to_layout(images, layout).astype(np.float32)
    if shuffle:
        ds.config.set_seed(seed)
    sharding = {} if shard is None else {"shard_id": shard[0], "num_shards": shard[1]}
    dataset = ds.NumpySlicesDataset({"data": data, "label": labels.astype(np.int32)}, shuffle=shuffle, **sharding)
    return dataset.batch(batch_size, drop_remainder=drop_remainder)
