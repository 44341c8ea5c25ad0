"""Unique Parameter-name prefixes for front-end instances (MindSpore needs unique names in one graph)."""

import itertools
import weakref

_OWNERS = weakref.WeakValueDictionary()


def check_name(name, argument="name"):
    """``name`` if it can prefix Parameter names: a non-empty str of letters, digits, '_' and '.'; else a
    ValueError naming ``argument``."""
    if not isinstance(name, str) or not name or not name.replace("_", "a").replace(".", "a").isalnum():
        raise ValueError(f"'{argument}' must be a non-empty str of letters, digits, '_' and '.', but got {name!r}.")
    return name


def claim_name(name, owner, default):
    """Reserve a Parameter-name prefix for ``owner``: ``name`` if given and free, else ``default``,
    ``default_1``, ``default_2``, ... (the first free one while its previous owner lives).

    Example:
        >>> class Owner:
        ...     pass
        >>> first, second = Owner(), Owner()
        >>> claim_name(None, first, "doc_scaler"), claim_name(None, second, "doc_scaler")
        ('doc_scaler', 'doc_scaler_1')
    """
    if name is None:
        name = free_name(default)
    check_name(name)
    if _OWNERS.get(name, owner) is not owner:
        raise ValueError(
            f"'name' {name!r} is already used by another {type(_OWNERS[name]).__name__}; its Parameters "
            f"would collide in a graph. Choose another name, or leave it None for a unique one."
        )
    _OWNERS[name] = owner
    return name


def free_name(name):
    """``name`` if no living owner holds it, else the first free ``name_1``, ``name_2``, ...

    Example:
        >>> free_name("doc_unused")
        'doc_unused'
    """
    return next(
        candidate
        for candidate in itertools.chain([name], (f"{name}_{n}" for n in itertools.count(1)))
        if candidate not in _OWNERS
    )
