"""How functions, arguments and results travel between the notebook and the ranks.

cloudpickle carries functions and classes defined in notebook cells by value. Two adjustments:
- cloudpickle renames every code object's file to ``<dynamic-code>``; we keep the real name (the cell's),
  so that a rank's traceback can show the cell's lines;
- a module that is in ``sys.modules`` under its own name travels as a name to import, even when
  cloudpickle takes it for a dynamic module (``torch.ops`` has no spec: a function reading any ``.ops``
  attribute next to ``torch`` could not travel otherwise);
- tensors on an accelerator travel as CPU tensors: unpickling a CUDA tensor in the kernel would create
  a CUDA context there and take memory on GPU 0, which a shared GPU box cannot afford.

Warning filters travel as names, not as pickled classes: unpickling a class imports its module, and the
kernel's own filters name classes from IPython, so every rank would import IPython on every launch.
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types
import warnings

import cloudpickle
import torch


def _named_code(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


def _same(x):
    return x


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._copies: dict[int, types.CodeType] = {}  # id -> copy, kept alive while pickling

    def reducer_override(self, obj):
        if type(obj) is types.CodeType and id(obj) not in self._copies:
            # A copy, not obj itself: pickle would answer a reference to obj inside its own reduction
            # with the inner (renamed) object. The copy takes cloudpickle's own path.
            copy = obj.replace()
            self._copies[id(copy)] = copy
            return _named_code, (copy, obj.co_filename)
        if isinstance(obj, types.ModuleType) and obj.__name__ != "__main__" and sys.modules.get(obj.__name__) is obj:
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            return _same, (obj.detach().to("cpu"),)
        return super().reducer_override(obj)


def dumps(obj) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf).dump(obj)
    return buf.getvalue()


loads = cloudpickle.loads


def warning_filters() -> list[tuple]:
    """The caller's warning filters as plain data: (action, message, (module, qualname), module, lineno)."""
    return [(action, getattr(message, "pattern", message) or "", (category.__module__, category.__qualname__),
             getattr(module, "pattern", module) or "", lineno)
            for action, message, category, module, lineno in warnings.filters]


def install_warning_filters(filters: list[tuple]) -> None:
    """Replace this process's warning filters by ``filters`` (from :func:`warning_filters`)."""
    warnings.resetwarnings()
    for action, message, (module_name, qualname), module, lineno in filters:
        warnings.filterwarnings(action, message, _warning_class(module_name, qualname), module, lineno, append=True)


class _MatchByName(type):
    """Stands in for a warning class whose module this process has not imported (or that was defined in a
    notebook cell): a warning matches when a class in its MRO has the same module and qualified name."""

    def __subclasscheck__(cls, other) -> bool:
        return any((c.__module__, c.__qualname__) == cls.names for c in getattr(other, "__mro__", ()))


def _warning_class(module_name: str, qualname: str) -> type:
    obj = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Warning):
        return obj
    return _MatchByName(qualname.rsplit(".", 1)[-1], (Warning,), {"names": (module_name, qualname)})
