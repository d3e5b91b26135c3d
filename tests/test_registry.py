"""The generic `Registry`: lookups that list the known names, descriptions, registering a name
again, load hooks; block and mixer registration checks its options and tolerates a re-import."""

import dataclasses
import itertools

import pytest

from experiments.scale import parse_list
from hybrid_jax.config import TrainConfig, apply_overrides
from hybrid_jax.registry import (
    Registry,
    block_type,
    did_you_mean,
    mixer_type,
    register_block,
    register_mixer,
)


def test_lookups_name_the_known_entries():
    widgets = Registry("widget")
    widgets.register("b", 2, "the second")
    widgets.register("a", 1, "the first")
    assert widgets.get("a") == 1 and "b" in widgets and "c" not in widgets
    assert widgets.names() == ["a", "b"]  # sorted, not in registration order
    assert widgets.describe("b") == "the second"
    with pytest.raises(ValueError, match=r"unknown widget 'c'; available widgets: \['a', 'b'\]"):
        widgets.get("c")
    with pytest.raises(ValueError, match=r"unknown widget 'c'; available widgets"):
        widgets.describe("c")


def test_a_mistyped_name_gets_the_closest_one():
    """The first thing a long list of names should say: which one was meant."""
    widgets = Registry("widget")
    for name in ("gdn-tiny", "gsa-tiny", "mamba2-tiny"):
        widgets.register(name, 0)
    with pytest.raises(ValueError, match=r"^unknown widget 'mamba-tiny' \(did you mean "
                                         r"'mamba2-tiny'\?\); available widgets: \["):
        widgets.get("mamba-tiny")
    assert did_you_mean("zzz", widgets.names()) == ""
    with pytest.raises(ValueError, match=r"unknown config key 'stepz' in TrainConfig \(did you "
                                         r"mean 'steps'\?\); allowed: \['steps'"):
        apply_overrides(TrainConfig(), ["stepz=3"])
    with pytest.raises(ValueError, match=r"--model: \['gdn-tinny'\] \(did you mean 'gdn-tiny'"
                                         r"\?\) not in \["):
        parse_list("gdn-tinny", "model", widgets.names())


def test_descriptions_default_to_the_values_own():
    """Without a description: the value's `description` attribute, else its docstring's first
    line, else ""; the decorator passes its description and returns the function."""
    widgets = Registry("widget")

    def documented():
        """First line.

        More."""

    class Described:
        """Not this."""

        description = "its own description"

    widgets.register("documented", documented)
    widgets.register("described", Described)
    widgets.register("bare", lambda: None)

    @widgets.decorator("decorated", "given")
    def decorated():
        """Not this either."""

    assert widgets.get("decorated") is decorated
    assert {name: widgets.describe(name) for name in widgets.names()} == {
        "bare": "", "decorated": "given", "described": "its own description",
        "documented": "First line."}


def test_registering_a_name_again():
    """The same value again (by `identity`) replaces the entry, a module imported twice; another
    value under a taken name is an error naming the one registered."""
    widgets = Registry("widget")
    widgets.register("w", ("build", 1), identity=lambda entry: entry[0])
    widgets.register("w", ("build", 2), "again", identity=lambda entry: entry[0])
    assert widgets.get("w") == ("build", 2) and widgets.describe("w") == "again"
    with pytest.raises(ValueError, match=r"widget 'w' is already registered \(build\)"):
        widgets.register("w", ("other", 3), identity=lambda entry: entry[0])
    widgets.register("v", [1])
    with pytest.raises(ValueError, match=r"widget 'v' is already registered \(\[1\]\)"):
        widgets.register("v", [1])  # equal, but not the same object
    assert widgets.get("w") == ("build", 2)


_modules = itertools.count()


@pytest.mark.parametrize("lookup", [lambda r: r.get("w"), lambda r: "w" in r,
                                    lambda r: r.names(), lambda r: r.describe("w")],
                         ids=["get", "in", "names", "describe"])
def test_every_lookup_runs_the_load_hook(lookup, tmp_path, monkeypatch):
    """A lookup imports the `load` modules first, so their entries are there whatever the
    caller imported."""
    host, entries = f"widget_host_{next(_modules)}", f"widget_entries_{next(_modules)}"
    (tmp_path / f"{host}.py").write_text(
        f"from hybrid_jax.registry import Registry\nWIDGETS = Registry('widget', "
        f"load=({entries!r},))\n")
    (tmp_path / f"{entries}.py").write_text(
        f"import {host}\n{host}.WIDGETS.register('w', 1, 'loaded')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    widgets = __import__(host).WIDGETS
    assert widgets._entries == {}
    assert lookup(widgets) in (1, True, ["w"], "loaded")


def test_blocks_and_mixers_check_their_options_and_tolerate_a_reimport():
    """Options must be a frozen dataclass (checked before anything is registered); registering
    a block's builder or a mixer's module again under its name is a no-op, another one an
    error."""
    @dataclasses.dataclass
    class Mutable:
        size: int = 1

    for register, kind in ((register_block, "block type"), (register_mixer, "mixer")):
        for options in (Mutable, dict):
            with pytest.raises(TypeError, match=f"options of {kind} 'widget' must be a frozen "
                                                "dataclass"):
                register("widget", options)(lambda *a, **k: None)
    attention = block_type("attention")
    register_block("attention", attention.options, attention.description,
                   defaults=dict(attention.defaults))(attention.build)
    assert block_type("attention") == attention
    with pytest.raises(ValueError, match="block type 'attention' is already registered"):
        register_block("attention", attention.options)(lambda *a, **k: None)
    mixer = mixer_type("attention")
    register_mixer("attention", mixer.options, mixer.description)(mixer.module)
    assert mixer_type("attention") == mixer and mixer.description
    with pytest.raises(ValueError, match="mixer 'attention' is already registered"):
        register_mixer("attention", mixer.options)(type("Other", (), {}))
    # A block type's defaults are kept as sorted pairs: "parallel" presets the generic block.
    assert block_type("parallel").defaults == (("layout", "parallel"),)
    # several, in name order whatever order they were given in (entries compare equal)
    from hybrid_jax.nn.pha import PHA_DEFAULTS

    assert block_type("pha").defaults == tuple(sorted(PHA_DEFAULTS.items()))
    assert [name for name, _ in block_type("pha").defaults] == [
        "branch_norm", "branches", "layout", "mixing", "residual"]


def test_experiments_and_sweeps_are_kept_apart():
    """A sweep may not take an experiment's name; `get_sweep` looks up sweeps only and says
    so; a registered entry must call itself by its name."""
    from types import SimpleNamespace

    from experiments import registry

    assert "expressivity/selective-copying" in registry.sweep_names()
    assert not set(registry.sweep_names()) & set(registry.names())
    with pytest.raises(ValueError, match="sweep 'mqar-transformer-tiny' is already registered "
                                         "as an experiment"):
        registry.register_sweep("mqar-transformer-tiny")
    assert "mqar-transformer-tiny" not in registry.sweep_names()
    sweep = registry.get_sweep("expressivity/selective-copying")
    assert sweep.name == "expressivity/selective-copying"
    with pytest.raises(ValueError, match=r"^unknown sweep 'mqar-transformer-tiny'.*available "
                                         r"sweeps: \['expressivity/"):
        registry.get_sweep("mqar-transformer-tiny")
    with pytest.raises(ValueError, match=r"^unknown experiment 'expressivity/mkar'"):
        registry.get("expressivity/mkar")
    widgets = Registry("widget")
    widgets.register("a", lambda: SimpleNamespace(name="b"))
    with pytest.raises(ValueError, match="widget registered as 'a' calls itself 'b'"):
        registry._named(widgets, "a")


def test_the_experiment_registry_loads_the_sweeps_itself():
    """A fresh interpreter that imports only `experiments.registry` sees the sweeps and the
    experiments (the registries' load hooks import their modules)."""
    import subprocess
    import sys

    code = ("from experiments import registry; print(len(registry.sweep_names()) > 0, "
            "'mqar-hybrid-tiny' in registry.names())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["True", "True"]


def test_a_name_is_an_experiments_or_a_sweeps_in_either_registration_order(monkeypatch):
    """Whichever registers second is refused. An experiment registered after a sweep of its
    name used to be accepted (a sweep module imported before the experiments), and `python -m
    experiments.run NAME` then ran the sweep."""
    from experiments import registry

    with pytest.raises(ValueError, match="experiment 'expressivity/mkar' is already "
                                         "registered as a sweep"):
        registry.register("expressivity/mkar")
    monkeypatch.setattr(registry, "EXPERIMENTS", Registry("experiment"))
    monkeypatch.setattr(registry, "SWEEPS", Registry("sweep"))
    registry.register_sweep("first-a-sweep")(lambda: None)
    with pytest.raises(ValueError, match="experiment 'first-a-sweep' is already registered "
                                         "as a sweep"):
        registry.register("first-a-sweep")
    registry.register("first-an-experiment")(lambda: None)
    with pytest.raises(ValueError, match="sweep 'first-an-experiment' is already registered "
                                         "as an experiment"):
        registry.register_sweep("first-an-experiment")
    assert registry.names() == ["first-an-experiment"]
    assert registry.sweep_names() == ["first-a-sweep"]
