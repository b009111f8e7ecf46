"""The ``_target_`` nodes a user adds to a run, one way for every extension: ``callbacks.<name>`` (conf/callbacks/,
:func:`lra.loop.user_callbacks`) and ``logger.<name>`` (conf/logger/, :func:`lra.loggers.make_logger`).

A node is ``{_target_: <module>.<Class>, ...its arguments}``, built as Hydra instantiates it. What can go wrong is
one line naming the node: a ``_target_`` that cannot be imported or is not of the kind the node's group takes
(checked before the run's folder exists), and arguments the class refuses (when it is built).
"""

from __future__ import annotations

import hydra.utils

from attention import ExternalImportError, import_contained
from lra.checks import ConfigError


def locate(key: str, target: str, what: str):
    """The object ``target`` (``<module>.<attr>``) names; one line if it cannot be imported, or if its module
    raises or exits as it is imported (:func:`attention.import_contained`, which also puts back the torch
    settings that module changed)."""
    module, _, attr = target.rpartition(".")
    try:
        return getattr(import_contained(module), attr)
    except ExternalImportError as e:
        raise ConfigError(f"{key}._target_={target!r}: {e}") from None
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(
            f"{key}._target_={target!r} cannot be imported ({type(e).__name__}: {e}): give "
            f"<module>.<Class> of {what} on the Python path"
        ) from None


def target_class(key: str, target: str, base: type, what: str, base_name: str) -> type:
    """The class ``target`` names, a subclass of ``base`` (``what``: e.g. "a Lightning callback"; ``base_name``:
    where users import ``base`` from, e.g. "lightning.pytorch.callbacks.Callback")."""
    cls = locate(key, target, what)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{key}._target_={target!r} is not {what}: give a subclass of {base_name}")
    return cls


def instantiate(key: str, node: dict, **late):
    """``node`` built with its arguments (Hydra's ``instantiate``); ``late``: arguments only the run knows,
    given to the target after the node's own (the harness's own loggers take the run this way)."""
    try:
        if not late:
            return hydra.utils.instantiate(node, _convert_="all")
        return hydra.utils.instantiate(node, _convert_="all", _partial_=True)(**late)
    except Exception as e:  # the user's class and arguments: one line naming them
        cause = e.__cause__ or e
        raise ConfigError(
            f"{key}: {node['_target_']}({', '.join(k for k in node if k != '_target_')}) "
            f"failed: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}; "
            f"check its arguments"
        ) from None
