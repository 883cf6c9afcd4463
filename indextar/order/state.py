"""The sampler's state dict: its fields and version, and the checks of a saved state.

:meth:`ResumableSampler.state_dict` writes ``version``, ``epoch``, ``consumed``, the
configuration fields that must match on load and, for information, ``num_replicas``;
:meth:`ResumableSampler.load_state_dict` reads a state back through the checks here,
whose errors name the field and the value. :func:`sampler_state_from_loader` finds the
sampler's state inside a ``StatefulDataLoader``'s.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import SamplerStateError

__all__ = ["STATE_VERSION", "sampler_state_from_loader"]

STATE_VERSION = 1
"""Version of the :meth:`~indextar.order.sampler.ResumableSampler.state_dict` format."""

# Fields that must match between a saved state and the sampler it is loaded into.
CONFIG_FIELDS = (
    "num_samples",
    "seed",
    "shuffle",
    "order",
    "drop_last",
    "block_size",
    "window_blocks",
    "part_sizes",  # a mixture's; its "weights" history is checked by MixturePlan.drift
    "selection",  # a where-view's: its expressions, count and digest (checked both ways)
)
_REQUIRED_FIELDS = ("epoch", "consumed")
_INFO_FIELDS = ("version", "num_replicas")
_KNOWN_FIELDS = frozenset(CONFIG_FIELDS + _REQUIRED_FIELDS + _INFO_FIELDS + ("weights",))


def state_epoch(state: Any) -> int:
    """The epoch of a saved ``state``, once its shape is checked: a mapping of known
    keys, with ``epoch`` and ``consumed``, of this :data:`STATE_VERSION`."""
    if not isinstance(state, Mapping):
        raise SamplerStateError(f"sampler state must be a mapping; got {type(state).__name__}")
    unknown = sorted(set(state) - _KNOWN_FIELDS, key=str)
    if unknown:
        raise SamplerStateError(
            f"sampler state has unknown keys {unknown}; known keys are {sorted(_KNOWN_FIELDS)}"
        )
    missing = [name for name in _REQUIRED_FIELDS if name not in state]
    if missing:
        raise SamplerStateError(f"sampler state is missing {missing}; it has {sorted(state)}")
    version = state.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise SamplerStateError(
            f"sampler state has version {version!r}; this sampler reads version {STATE_VERSION}"
        )
    epoch = _state_int(state, "epoch")
    if epoch < 0:
        raise SamplerStateError(f"sampler state has epoch={epoch}; expected >= 0")
    return epoch


def config_drift(
    state: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    fields: Sequence[str] = CONFIG_FIELDS,
    what: str = "sampler state",
) -> Iterator[str]:
    """One message for each of ``fields`` that ``state`` (``what``, in the message) has
    with another value than ``config``."""
    for name in fields:
        # A selection is refused both ways: a state saved without one does not resume
        # over a selection, which may have the same length by chance.
        recorded = name in state or (name == "selection" and name in config)
        if recorded and state.get(name) != config.get(name):
            yield (
                f"{what} was saved with {name}={state.get(name)!r}; "
                f"this sampler has {name}={config.get(name)!r}"
            )


def selection_of(data_source: Any) -> Any:
    """What a sampler records of ``data_source``'s selection: a where-view's ``selection``
    (a JSON-serialisable dict), or a mixture's parts' (a list, ``None`` for a part
    without); ``None`` when there is none."""
    selection = getattr(data_source, "selection", None)
    if selection is not None:
        return selection
    parts = getattr(data_source, "datasets", None)
    if isinstance(parts, list | tuple):
        selections = [getattr(part, "selection", None) for part in parts]
        if any(item is not None for item in selections):
            return selections
    return None


def state_consumed(state: Mapping[str, Any], num_samples: int) -> int:
    """The ``consumed`` of a saved ``state``, checked against ``num_samples``."""
    consumed = _state_int(state, "consumed")  # a SamplerStateError of its own
    try:
        return check_consumed(consumed, num_samples)
    except ValueError as error:
        raise SamplerStateError(f"sampler state: {error}") from error


def check_consumed(consumed: int, num_samples: int) -> int:
    """``consumed`` if it is a position of an epoch of ``num_samples``; ``ValueError`` if not."""
    consumed = as_int("consumed", consumed)
    if consumed < 0:
        raise ValueError(f"consumed={consumed} is negative")
    if consumed > num_samples:
        raise ValueError(
            f"consumed={consumed} exceeds num_samples={num_samples}; a finished "
            f"epoch e is saved as epoch=e + 1, consumed=0"
        )
    return consumed


def sampler_state_from_loader(loader_state: Mapping[str, Any]) -> dict[str, Any]:
    """Find the :class:`ResumableSampler` state inside a ``StatefulDataLoader`` state.

    torchdata's ``StatefulDataLoader.load_state_dict`` refuses a state saved with
    another ``num_workers``. The sampler's part does not depend on workers: load it
    into the sampler of a fresh loader, with any ``num_workers``, instead.

    Raises
    ------
    SamplerStateError
        If ``loader_state`` holds no sampler state, or was saved between snapshots
        (use ``snapshot_every_n_steps=1``, the default).
    """
    steps_since = loader_state.get("_steps_since_snapshot", 0)
    if steps_since:
        raise SamplerStateError(
            f"loader state is {steps_since} steps past its last snapshot; save it with "
            f"StatefulDataLoader(snapshot_every_n_steps=1)"
        )
    pending: list[Any] = [loader_state]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            found = item.get("sampler_state")
            if isinstance(found, Mapping) and "consumed" in found and "epoch" in found:
                return dict(found)
            pending.extend(item.values())
    raise SamplerStateError("loader state holds no ResumableSampler state ('sampler_state')")


def as_int(name: str, value: Any) -> int:
    """``value`` as an int (anything with ``__index__`` but a bool); ``TypeError`` naming
    ``name`` if not."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got {value!r}")
    try:
        return operator.index(value)
    except TypeError as error:
        raise TypeError(f"{name} must be an int; got {value!r}") from error


def _state_int(state: Mapping[str, Any], name: str) -> int:
    try:
        return as_int(name, state[name])
    except TypeError as error:
        raise SamplerStateError(f"sampler state: {error}") from error
