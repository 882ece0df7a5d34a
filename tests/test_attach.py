"""Instruments attach from outside: a log, a timeline or a tracker sees what runs inside its ``with``."""

import pytest
import torch

import parlab
from parlab.lab.measure import ActivationTracker, CommLog, Timeline
from parlab.lab.measure.attach import attach, attached, detach, not_activations, span
from parlab.lab.parallel.comm import communicate


def _nested_logs():
    t = torch.ones(4)
    with CommLog() as outer:
        with CommLog() as inner, Timeline() as tl:
            with span("work"):
                communicate("all_reduce", t, label="inside")
            late = communicate("all_reduce", t, async_op=True, label="issued inside")
        late.wait()  # completes after the block: still lands where it was issued
        communicate("all_reduce", t, label="outside")
    communicate("all_reduce", t, label="nobody")
    return ([r.label for r in outer.records], [r.label for r in inner.records], [e.name for e in tl.events],
            attached("comm"), attached("timeline"))


def test_a_log_sees_what_runs_inside_it_and_nothing_after():
    for outer, inner, spans, comm, timelines in parlab.launch(_nested_logs, world_size=2, timeout=30,
                                                               output="none", announce=False):
        assert sorted(inner) == ["inside", "issued inside"]
        assert sorted(outer) == ["inside", "issued inside", "outside"]
        assert spans == ["work"]
        assert comm == () and timelines == ()


def test_span_without_a_timeline_does_nothing_and_detach_twice_is_an_error():
    with span("nothing attached"):
        pass
    log = CommLog()
    attach("comm", log)
    detach("comm", log)
    with pytest.raises(RuntimeError, match="not attached"):
        detach("comm", log)
    with pytest.raises(ValueError, match="instrument kind"):
        attached("tracker")


def test_not_activations_hides_a_block_from_a_tracker_outside():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(8, 64)
    with ActivationTracker(exclude=[w]) as counted:
        (x @ w).tanh().sum()
    with ActivationTracker(exclude=[w]) as hidden:
        with not_activations():
            (x @ w).tanh().sum()
    assert counted.peak > 0 and hidden.peak == 0


INSTRUMENTS = {"on_collective", "timeline", "tracker"}


def instrument_parameters(modules) -> dict[str, list[str]]:
    """{qualified name: instrument parameters} of every function, class and method defined in ``modules``."""
    import inspect

    found = {}
    for module in modules:
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            members = [obj] + ([m for m in vars(obj).values() if inspect.isfunction(m)] if inspect.isclass(obj) else [])
            for f in members:
                try:
                    params = set(inspect.signature(f).parameters)
                except (TypeError, ValueError):
                    continue
                if params & INSTRUMENTS:
                    found[f"{module.__name__}.{getattr(f, '__qualname__', name)}"] = sorted(params & INSTRUMENTS)
    return found


def strategy_modules():
    import importlib
    import pkgutil

    import parlab.lab.parallel

    names = [f"parlab.lab.parallel.{m.name}" for m in pkgutil.iter_modules(parlab.lab.parallel.__path__)]
    names += ["parlab.lab.compose", "parlab.lab.compose_models", "parlab.lab.builtin", "parlab.lab.training"]
    return [importlib.import_module(n) for n in names]


def test_no_strategy_takes_an_instrument():
    modules = strategy_modules()
    assert len(modules) > 20  # every strategy module of the lab, not a few
    assert instrument_parameters(modules) == {}


def test_a_strategy_that_takes_an_instrument_is_found():
    import types

    planted = types.ModuleType("planted")

    class Strategy:
        def __init__(self, model, on_collective=None):
            pass

    def step(model, *, timeline=None):
        pass

    Strategy.__module__ = step.__module__ = "planted"
    planted.Strategy, planted.step = Strategy, step
    found = {name.replace("test_a_strategy_that_takes_an_instrument_is_found.<locals>.", ""): params
             for name, params in instrument_parameters([planted]).items()}
    assert found == {"planted.Strategy": ["on_collective"], "planted.Strategy.__init__": ["on_collective"],
                     "planted.step": ["timeline"]}
