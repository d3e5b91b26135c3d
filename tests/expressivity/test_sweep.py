"""Model sizing and a 2-cell sweep end to end: training, variants, resumption, CSV/MD/PNG."""

import concurrent.futures
import csv
import dataclasses
import json

import pytest

from experiments import registry
from experiments.expressivity.models import (
    ARCHITECTURES,
    STUDY_ARCHITECTURES,
    ModelFamily,
    parameter_count,
    size_model,
)
from experiments.expressivity.sweep import DEFAULT_TRAIN, Sweep
from experiments.run import main as run_main
from hybrid_jax.data.tasks import SelectiveCopyingConfig


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
@pytest.mark.parametrize("budget", [1000, 6000])
def test_size_model_is_closest_to_the_budget(architecture, budget):
    family = ModelFamily()
    config, params = size_model(family, architecture, budget, vocab_size=22)
    assert params == parameter_count(config) and 0.6 < params / budget < 1.6
    step = 2 * family.num_heads
    for other in (config.d_model - step, config.d_model + step):
        if other >= step:  # no neighbouring width is closer (in ratio) to the budget
            count = parameter_count(family.config(architecture, other, 22))
            assert abs(count / budget - 1) >= abs(params / budget - 1) or count > budget * 1.6
    kinds = "".join("A" if s.type == "attention" else "S" for s in config.layers)
    assert kinds == ARCHITECTURES[architecture] and config.ffn_dim == 0
    assert all(s.options == (("window", 16),) for s in config.layers if s.type == "attention")


def test_family_options_reach_the_layers():
    family = ModelFamily(ssm_type="mamba1", ssm_options=(("state_size", 4),), window=None,
                         ffn_ratio=2.0, repeats=2)
    config = family.config("ssm-attention", 12, vocab_size=10)
    assert [s.type for s in config.layers] == ["mamba1", "attention"] * 2
    assert config.block_options(0).state_size == 4 and config.block_options(1).window is None
    assert config.ffn_dim == 24
    with pytest.raises(ValueError, match="unknown architecture 'mlp'"):
        family.config("mlp", 12, 10)


def test_learned_positions_count_in_every_architecture():
    """position='learned': no RoPE, a [max_positions, d_model] table in every architecture."""
    rope, learned = ModelFamily(), ModelFamily(position="learned", max_positions=50)
    for architecture in ARCHITECTURES:
        config = learned.config(architecture, 12, vocab_size=10)
        assert config.position_embedding == "learned" and config.max_positions == 50
        assert config.rope_fraction == 0.0
        assert parameter_count(config) == parameter_count(
            rope.config(architecture, 12, vocab_size=10)) + 50 * 12
    with pytest.raises(ValueError, match=r"ModelFamily.position='alibi': expected one of"):
        ModelFamily(position="alibi")
    with pytest.raises(ValueError, match=r"rope_fraction=0.5: applies to position='rope'"):
        ModelFamily(position="learned", rope_fraction=0.5)


def test_bad_sweeps_are_named():
    with pytest.raises(ValueError, match="unknown architecture"):
        Sweep(name="x", data=SelectiveCopyingConfig(), architectures=("rnn",))
    with pytest.raises(ValueError, match="eval variant 'long'"):
        Sweep(name="x", data=SelectiveCopyingConfig(), eval_variants=(("long", (("len", 2),)),))
    with pytest.raises(ValueError, match="budgets is empty"):
        Sweep(name="x", data=SelectiveCopyingConfig(), budgets=())


def test_every_registered_sweep_builds():
    for name in registry.sweep_names():
        sweep = registry.get_sweep(name)
        assert sweep.cells() and name.startswith("expressivity/")
    # The selective-copying sweeps share their cells: one family, window 20, the paper's
    # attention (one head, RoPE on a quarter of it); MKAR has the same attention, full window.
    copying = [registry.get_sweep(f"expressivity/{n}")
               for n in ("selective-copying", "length-generalisation", "ood")]
    assert {s.family for s in copying} == {copying[0].family}
    assert (copying[0].family.window, copying[0].family.num_heads,
            copying[0].family.rope_fraction) == (20, 1, 0.25)
    mkar = registry.get_sweep("expressivity/mkar").family
    assert mkar == dataclasses.replace(copying[0].family, window=None)
    # The one-layer transformer is a depth ablation: only the sweeps that ask for it run it.
    assert Sweep(name="x", data=SelectiveCopyingConfig()).architectures == STUDY_ARCHITECTURES
    assert "transformer-1layer" not in STUDY_ARCHITECTURES
    assert "transformer-1layer" in copying[0].architectures


def test_two_cell_sweep_end_to_end(tmp_path, capsys):
    """`python -m experiments.run expressivity/length-generalisation` on 2 tiny cells: trains,
    writes the report; a rerun with an eval variant only evaluates it (no retraining), and a
    third run finds nothing to do."""
    argv = ["expressivity/length-generalisation", "--out", str(tmp_path), "--jobs", "1",
            "--set", 'architectures=["transformer","ssm-attention"]', "--set", "budgets=[400]",
            "--set", "learning_rates=[0.01]", "--set", "train.steps=3",
            "--set", "train.warmup_steps=1",
            "--set", "train.batch_size=8", "--set", "train.eval_batches=1",
            "--set", "train.log_every=1", "--set", "data.seq_len=24",
            "--set", "eval_variants=[]"]
    assert run_main(argv) == 0
    cells = sorted(tmp_path.glob("cells/*/cell.json"))
    assert [p.parent.name for p in cells] == ["ssm-attention-p400-lr0.01-s0",
                                              "transformer-p400-lr0.01-s0"]
    summary = json.loads(cells[0].read_text())
    assert summary["layers"] == ["mamba1", "attention"] and summary["steps"] == 3
    assert 0 <= summary["accuracy"] <= 1 and summary["params"] > 0
    trained = (cells[0].parent / "metrics.jsonl").read_text()

    variant = ["--set", 'eval_variants=[["length 48", [["seq_len", 48]]]]']
    capsys.readouterr()
    assert run_main(argv + variant) == 0
    assert "0 already finished, running 2" in capsys.readouterr().out
    assert (cells[0].parent / "metrics.jsonl").read_text() == trained  # not retrained
    assert 0 <= json.loads(cells[0].read_text())["accuracy[length 48]"] <= 1
    assert json.loads(cells[0].read_text())["variants"] == {"length 48": {"seq_len": 48}}
    # The same label with other changes reused the length-48 accuracy as length 96's.
    other = ["--set", 'eval_variants=[["length 48", [["seq_len", 96]]]]']
    assert run_main(argv + other) == 2
    assert "holds eval variant 'length 48' evaluated with {'seq_len': 48}, not " \
           "{'seq_len': 96}" in capsys.readouterr().err
    assert run_main(argv + variant + ["--report-only"]) == 0
    rows = list(csv.DictReader((tmp_path / "length-generalisation.csv").open()))
    assert {r["architecture"] for r in rows} == {"transformer", "ssm-attention"}
    assert "accuracy[length 48]" in rows[0] and int(rows[0]["params"]) > 0
    table = (tmp_path / "length-generalisation.md").read_text()
    assert "| Hybrid SSM→Attn |" in table and "length 48" in table
    assert (tmp_path / "length-generalisation.png").read_bytes()[:4] == b"\x89PNG"

    assert run_main(argv + variant) == 0
    assert "2 already finished, running 0" in capsys.readouterr().out
    # A config.json written before ModelConfig had its position fields is the same run.
    saved = json.loads((cells[0].parent / "config.json").read_text())
    del saved["model"]["position_embedding"], saved["model"]["max_positions"]
    (cells[0].parent / "config.json").write_text(json.dumps(saved))
    assert run_main(argv + variant) == 0
    assert "2 already finished, running 0" in capsys.readouterr().out
    assert run_main(argv + variant + ["--set", "train.steps=4"]) == 2
    assert "made with another configuration" in capsys.readouterr().err
    # --report-only reported these 3-step cells as "after 4 steps".
    assert run_main(argv + variant + ["--set", "train.steps=4", "--report-only"]) == 2
    assert "made with another configuration" in capsys.readouterr().err

    # Another sweep over the same cells (OOD evaluation of the same models) only evaluates.
    capsys.readouterr()
    ood = ["expressivity/ood", *argv[1:-2],
           "--set", 'eval_variants=[["dense", [["number_prob", 0.4]]]]']
    assert run_main(ood) == 0
    assert "0 already finished, running 2" in capsys.readouterr().out
    assert (cells[0].parent / "metrics.jsonl").read_text() == trained
    assert 0 <= json.loads(cells[0].read_text())["accuracy[dense]"] <= 1


class _ThreadPool(concurrent.futures.ThreadPoolExecutor):
    """The sweep's process pool in threads of this process (where the fake `train` is)."""

    def __init__(self, jobs, mp_context=None, initializer=None):
        super().__init__(jobs)


@pytest.mark.parametrize(("jobs", "stop"), [(1, "signal"), (2, "signal"), (1, "keyboard")])
def test_a_signal_stops_the_whole_sweep(tmp_path, monkeypatch, capsys, jobs, stop):
    """A cell stopped by a signal (or Ctrl-C outside training) ends the sweep with 128 + signal:
    no further cell starts (with 2 jobs the 2 running cells stop). The sweep used to record the
    cell as failed and train the next."""
    import hybrid_jax.train

    started = []

    def train(experiment, run_dir, **kwargs):
        started.append(run_dir.name)
        if stop == "keyboard":
            raise KeyboardInterrupt
        return {"interrupted": "SIGTERM", "step": 2, "accuracy": None}

    monkeypatch.setattr(hybrid_jax.train, "train", train)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _ThreadPool)
    argv = ["expressivity/selective-copying", "--out", str(tmp_path), "--jobs", str(jobs),
            "--set", 'architectures=["transformer","ssm"]', "--set", "budgets=[400]",
            "--set", "learning_rates=[0.01,0.003]"]
    assert run_main(argv) == (130 if stop == "keyboard" else 143)
    assert len(started) == jobs and not list(tmp_path.glob("cells/*/cell.json"))
    err = capsys.readouterr().err
    assert "run the same command again to continue" in err
    if stop == "signal":
        assert "interrupted (SIGTERM in cell " in err and " at step 2)" in err


def test_sigterm_to_the_sweep_alone_waits_for_its_running_cells(tmp_path, monkeypatch, capsys):
    """With worker processes, SIGTERM to the sweep's own process only (a container's PID 1):
    no new cell starts, the running ones finish, exit 143. It used to kill the sweep at once
    and leave the workers training, orphaned."""
    import os
    import signal
    import time

    import hybrid_jax.train

    started = []

    def train(experiment, run_dir, **kwargs):
        started.append(run_dir.name)
        if len(started) == 1:  # once both cells run: to the process, not to these "workers"
            for _ in range(100):
                if len(started) < 2:
                    time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"accuracy": 0.5, "eval_loss": 1.0, "wall_time_s": 1.0, "steps": 1000}

    monkeypatch.setattr(hybrid_jax.train, "train", train)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _ThreadPool)
    argv = ["expressivity/selective-copying", "--out", str(tmp_path), "--jobs", "2",
            "--set", 'architectures=["transformer","ssm"]', "--set", "budgets=[400]",
            "--set", "learning_rates=[0.01,0.003]", "--set", "eval_variants=[]"]
    before = signal.getsignal(signal.SIGTERM)
    assert run_main(argv) == 143
    assert len(started) == 2 and len(list(tmp_path.glob("cells/*/cell.json"))) == 2
    assert "interrupted (SIGTERM); finished cells" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # restored


def test_report_only_without_finished_cells_is_an_error(tmp_path, capsys):
    assert run_main(["expressivity/mqar", "--report-only", "--out", str(tmp_path / "x")]) == 2
    assert f"--report-only: no finished cell of expressivity/mqar in {tmp_path / 'x'}" in \
        capsys.readouterr().err


def test_a_second_signal_to_the_sweep_stops_it_at_once():
    """The first SIGINT / SIGTERM is only recorded (nothing raised inside the pool's
    bookkeeping); a second one raises; the handlers are restored after."""
    import os
    import signal
    import time

    from experiments.expressivity.sweep import SweepStopped, _StopSignals

    def deliver(signum):
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # the handler runs in this thread at its next bytecode

    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with pytest.raises(SweepStopped, match="SIGINT"), _StopSignals() as stop:
        deliver(signal.SIGTERM)
        assert stop.received == "SIGTERM"
        deliver(signal.SIGINT)
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


def test_an_output_path_that_is_a_file_is_one_line(tmp_path, capsys):
    """It was a FileExistsError traceback."""
    (tmp_path / "out").touch()
    assert run_main(["expressivity/mqar", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "experiments.run expressivity/mqar: error: I/O error: " \
        f"File exists: {tmp_path / 'out'}\n"


def test_jobs_below_one_are_refused(tmp_path, capsys):
    """`--jobs 0` (or -3) ran the cells in this process as if 1."""
    assert run_main(["expressivity/selective-copying", "--out", str(tmp_path), "--jobs", "0"]) == 2
    assert "jobs=0: expected an integer >= 1" in capsys.readouterr().err
    assert not list(tmp_path.glob("cells/*"))


def test_two_worker_processes_run_every_cell(tmp_path):
    """The process pool for real (spawned workers, at most 2 cells submitted at a time): all
    4 cells finish."""
    argv = ["expressivity/selective-copying", "--out", str(tmp_path), "--jobs", "2",
            "--set", 'architectures=["transformer","ssm"]', "--set", "budgets=[400]",
            "--set", "learning_rates=[0.01,0.003]", "--set", "train.steps=2",
            "--set", "train.warmup_steps=1", "--set", "train.batch_size=4",
            "--set", "train.eval_batches=1", "--set", "train.mesh.data=1",
            "--set", "data.seq_len=24", "--set", "eval_variants=[]"]
    assert run_main(argv) == 0
    assert len(list(tmp_path.glob("cells/*/cell.json"))) == 4


# --- pinned by hand (a mutation sweep of models.py, tables.py and the Sweep logic) -----------

def _attention_only_count(d, vocab, layers):
    """Tied embedding [vocab, d]; per layer q, k, v, o (4·d², no bias) and its norm; final norm."""
    return vocab * d + layers * (4 * d * d + d) + d


def test_architectures_are_the_papers_layer_orders():
    family = ModelFamily()
    kinds = {a: [s.type for s in family.config(a, 8, 10).layers] for a in ARCHITECTURES}
    assert kinds == {"transformer": ["attention", "attention"], "ssm": ["mamba1", "mamba1"],
                     "ssm-attention": ["mamba1", "attention"],
                     "attention-ssm": ["attention", "mamba1"],
                     "transformer-1layer": ["attention"]}
    # Positions reach the layers: RoPE on the family's fraction of each head.
    assert ModelFamily(rope_fraction=0.25).config("ssm", 8, 10).rope_fraction == 0.25


def test_parameter_counts_by_hand():
    """Embeddings included (tied), no FFN: d_model 8 and 12 over a vocabulary of 10."""
    family = ModelFamily()
    for d in (8, 12):
        assert parameter_count(family.config("transformer-1layer", d, 10)) == \
            _attention_only_count(d, 10, 1)
        assert parameter_count(family.config("transformer", d, 10)) == \
            _attention_only_count(d, 10, 2)
    assert _attention_only_count(8, 10, 1) == 352  # 80 + 264 + 8


def test_size_model_is_closest_in_ratio_not_in_difference():
    """transformer-1layer, vocabulary 10: d_model 4 has 112 parameters, d_model 8 has 352.
    210 is nearer 112 in difference (98 < 142) but nearer 352 in ratio (352/210 < 210/112);
    190 is nearer 112 in both."""
    family = ModelFamily()
    assert _attention_only_count(4, 10, 1) == 112
    config, params = size_model(family, "transformer-1layer", 210, vocab_size=10)
    assert (config.d_model, params) == (8, 352)
    config, params = size_model(family, "transformer-1layer", 190, vocab_size=10)
    assert (config.d_model, params) == (4, 112)


def test_size_model_at_the_ends_of_the_width_range():
    """The smallest width (2·num_heads) for a budget below it; max_d_model itself for a budget
    above every width; a budget that is not positive is refused."""
    family = ModelFamily(max_d_model=12)
    config, params = size_model(family, "transformer-1layer", 1, vocab_size=10)
    assert (config.d_model, params) == (4, _attention_only_count(4, 10, 1))
    config, params = size_model(family, "transformer-1layer", 10**6, vocab_size=10)
    assert (config.d_model, params) == (12, _attention_only_count(12, 10, 1))
    with pytest.raises(ValueError, match="budget=0: expected a positive number"):
        size_model(family, "transformer", 0, vocab_size=10)


PAPER = {  # experiments/README.md, as the reproduction harness quotes the paper's figures
    "selective-copying": {2000: {"ssm-attention": 0.999, "transformer": 0.352, "ssm": 0.305},
                          6000: {"ssm-attention": 1.000, "transformer": 0.727, "ssm": 0.485},
                          12000: {"transformer": 0.923, "ssm": 0.931}},
    "mkar": {6000: {"ssm-attention": 0.990, "transformer": 0.230, "ssm": 0.356,
                    "attention-ssm": 0.286}},
}


def test_registered_sweeps_match_the_readme():
    """The grids of experiments/README.md's sweep table and the paper's numbers by cell."""
    sweeps = {name.split("/")[1]: registry.get_sweep(name) for name in registry.sweep_names()}
    for name, sweep in sweeps.items():
        assert sweep.learning_rates == (0.003, 0.01) and sweep.seeds == (0,), name
    for name in ("selective-copying", "mkar"):
        assert {b: dict(row) for b, row in sweeps[name].paper} == PAPER[name]
        assert sweeps[name].architectures == STUDY_ARCHITECTURES + ("transformer-1layer",)
    assert sweeps["selective-copying"].budgets == (2000, 6000)
    assert sweeps["mkar"].budgets == (6000,) and sweeps["mkar"].train.steps == 1500
    for name in ("length-generalisation", "ood"):  # the selective-copying 6k models
        assert sweeps[name].data == sweeps["selective-copying"].data
        assert sweeps[name].family == sweeps["selective-copying"].family
        assert sweeps[name].budgets == (6000,)
    same_cells = ("data", "family", "architectures", "budgets", "learning_rates", "seeds",
                  "train", "paper")
    for field in same_cells:  # the MKAR models
        assert getattr(sweeps["mkar-length-generalisation"], field) == \
            getattr(sweeps["mkar"], field), field
    variants = {name: {label: dict(changes) for label, changes in s.eval_variants}
                for name, s in sweeps.items() if s.eval_variants}
    assert variants == {
        "length-generalisation": {"length 200": {"seq_len": 200}, "length 400": {"seq_len": 400}},
        "mkar-length-generalisation": {"length 200": {"seq_len": 200},
                                       "length 400": {"seq_len": 400}},
        "ood": {"number prob 0.1": {"number_prob": 0.1}, "number prob 0.4": {"number_prob": 0.4}},
        "needle": {"depth 0-0.1": {"min_depth": 0.0, "max_depth": 0.1},
                   "depth 0.9-1": {"min_depth": 0.9, "max_depth": 1.0},
                   "length 200": {"seq_len": 200}}}


def test_cells_are_the_whole_grid_in_order():
    sweep = Sweep(name="expressivity/x", data=SelectiveCopyingConfig(),
                  architectures=("ssm", "transformer"), budgets=(400, 800),
                  learning_rates=(0.01, 0.003), seeds=(0, 1))
    ids = [c.id for c in sweep.cells()]
    assert len(ids) == len(set(ids)) == 16
    assert ids[:3] == ["ssm-p400-lr0.01-s0", "ssm-p400-lr0.01-s1", "ssm-p400-lr0.003-s0"]
    assert ids[-1] == "transformer-p800-lr0.003-s1"
    cell = sweep.cells()[-1]
    experiment, params = sweep.experiment(cell)
    assert (experiment.train.learning_rate, experiment.train.seed) == (0.003, 1)
    assert experiment.name == "expressivity/x/transformer-p800-lr0.003-s1"
    assert params == parameter_count(experiment.model) and sweep.short_name == "x"
    with pytest.raises(ValueError, match="'expressivity/x': seeds is empty"):
        dataclasses.replace(sweep, seeds=())
    with pytest.raises(ValueError, match="learning_rates is empty"):
        dataclasses.replace(sweep, learning_rates=())
    # Repeated grid values made cells with the same id (trained or evaluated twice, counted
    # twice); a paper row of an unknown architecture broke the report after the whole sweep.
    with pytest.raises(ValueError, match=r"budgets=\[400, 800, 400\] repeats \[400\]; expected"):
        dataclasses.replace(sweep, budgets=(400, 800, 400))
    with pytest.raises(ValueError, match=r"learning_rates=\[0.01, 0.01\] repeats \[0.01\]"):
        dataclasses.replace(sweep, learning_rates=(0.01, 1e-2))
    # Rates that differ past 6 significant digits were one cell id (`:g`): one directory.
    close = dataclasses.replace(sweep, learning_rates=(0.01, 0.010000001), seeds=(0,))
    assert [c.id for c in close.cells()][:2] == ["ssm-p400-lr0.01-s0", "ssm-p400-lr0.010000001-s0"]
    with pytest.raises(ValueError, match=r"paper names unknown architecture\(s\) \['mamba'\]"):
        dataclasses.replace(sweep, paper=((2000, (("ssm", 0.3), ("mamba", 0.5))),))
    # Eval variants parsed from --set JSON (lists) become tuples: the sweep stays hashable.
    listed = dataclasses.replace(sweep, eval_variants=[["long", [["seq_len", 200]]]])
    assert listed.eval_variants == (("long", (("seq_len", 200),)),) and hash(listed)
    assert listed.variant_data("long").seq_len == 200


def test_missing_variants_and_collect(tmp_path):
    """`collect` reads only this sweep's cells, in grid order (a shared --out directory holds
    other sweeps' cells too); `missing_variants` names the variants a summary lacks."""
    from experiments.expressivity.sweep import cell_summary_path, collect, missing_variants

    sweep = Sweep(name="expressivity/x", data=SelectiveCopyingConfig(), budgets=(400,),
                  architectures=("transformer", "ssm"),
                  eval_variants=(("long", (("seq_len", 200),)), ("dense", (("number_prob", 0.4),))))
    assert missing_variants(sweep, {"accuracy": 0.5, "accuracy[long]": 0.4}) == ["dense"]
    assert missing_variants(sweep, {"accuracy[dense]": 0.1, "accuracy[long]": 0.4}) == []
    other = Sweep(name="expressivity/y", data=SelectiveCopyingConfig(), budgets=(400, 800),
                  architectures=("ssm", "transformer", "attention-ssm"))
    for i, cell in enumerate(other.cells()):
        path = cell_summary_path(tmp_path, cell)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"id": cell.id, "i": i}))
    assert [s["id"] for s in collect(sweep, tmp_path)] == ["transformer-p400-lr0.003-s0",
                                                           "ssm-p400-lr0.003-s0"]


@pytest.mark.parametrize(("change", "field"), [
    (dict(data=SelectiveCopyingConfig(seq_len=30)), "data"),
    (dict(family=ModelFamily(window=8)), "model"),
    (dict(train=dataclasses.replace(DEFAULT_TRAIN, steps=700)), "train"),
])
def test_a_cell_trained_otherwise_is_refused(tmp_path, change, field):
    """A cell directory's config.json that differs in data, model or training is another
    run; the name and description may differ (sweeps share cells)."""
    from experiments.expressivity.sweep import _check_same_run
    from hybrid_jax.config import to_dict

    sweep = Sweep(name="expressivity/x", data=SelectiveCopyingConfig(), budgets=(400,))
    cell = sweep.cells()[0]
    experiment, _ = sweep.experiment(cell)
    renamed = dataclasses.replace(experiment, name="other", description="other")
    (tmp_path / "config.json").write_text(json.dumps(to_dict(renamed)))
    _check_same_run(experiment, tmp_path)
    changed, _ = dataclasses.replace(sweep, **change).experiment(cell)
    with pytest.raises(ValueError, match=rf"another configuration \(\['{field}'\] differ\)"):
        _check_same_run(changed, tmp_path)
    # A summary whose config.json is gone was reported unchecked, whatever trained it.
    (tmp_path / "cell.json").write_text("{}")
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="holds cell.json but no config.json"):
        _check_same_run(changed, tmp_path)


@pytest.mark.parametrize("name, hint", [
    ("expressivity/selective-copyin", "(did you mean 'expressivity/selective-copying'?)"),
    ("expressivity/nope", "; sweeps: ['expressivity/ar-decoding'"),
    ("selective-copying", "(did you mean 'expressivity/selective-copying'?)"),
])
def test_a_mistyped_sweep_is_named_with_the_sweeps(name, hint, capsys):
    """`python -m experiments.run` with a sweep's name mistyped said only 'unknown experiment',
    listing the experiments and no sweep."""
    assert run_main([name, "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"python -m experiments.run: error: unknown experiment or sweep "
                          f"{name!r}") and hint in err and len(err.splitlines()) == 1


def test_options_before_the_sweeps_name(tmp_path, capsys):
    """`--out DIR SWEEP` ran the train command, which called the sweep an unknown experiment;
    a directory named like a sweep, before an experiment's name, is still a directory."""
    assert run_main(["--out", str(tmp_path / "x"), "--report-only", "expressivity/mqar"]) == 2
    assert "--report-only: no finished cell of expressivity/mqar" in capsys.readouterr().err
    assert run_main(["--out", "expressivity/mqar", "mqar-transformer-tinny"]) == 2
    assert "(did you mean 'mqar-transformer-tiny'?)" in capsys.readouterr().err


def test_a_mistyped_experiment_still_gets_the_train_commands_error(capsys):
    assert run_main(["mqar-transformer-tinny", "--out", "/nonexistent"]) == 2
    assert "(did you mean 'mqar-transformer-tiny'?)" in capsys.readouterr().err


def test_help_names_the_sweeps_and_where_the_options_are(capsys):
    """`python -m experiments.run --help` showed `hybrid-jax train`'s usage, no sweep."""
    assert run_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m experiments.run NAME")
    assert "expressivity/selective-copying" in out and "hybrid-jax train --help" in out
    assert run_main([]) == 2 and "usage: python -m experiments.run" in capsys.readouterr().err


# --- a fake trainer: what the sweep does with cells that fail, stop early or break a worker ---

FAKE_ARGV = ["expressivity/selective-copying", "--set", 'architectures=["transformer","ssm"]',
             "--set", "budgets=[400]", "--set", "learning_rates=[0.01]"]


def _fake_train(monkeypatch, outcomes):
    """`train` returns `outcomes[cell]` (a dict of results, or an exception to raise) and
    writes the cell's config.json as the trainer does."""
    import hybrid_jax.train
    from hybrid_jax.config import to_dict

    def train(experiment, run_dir, **kwargs):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(experiment)))
        outcome = outcomes[run_dir.name]
        if isinstance(outcome, BaseException):
            raise outcome
        return {"eval_loss": 1.25, "wall_time_s": 1.0, **outcome}

    monkeypatch.setattr(hybrid_jax.train, "train", train)


def test_a_failed_cell_is_named_in_the_report_and_the_others_are_kept(tmp_path, monkeypatch,
                                                                     capsys):
    """The report said nothing of a failed cell (its entry a bare '–'); the summary's steps
    were the configured ones, also for a cell that train.time_limit_s stopped early."""
    argv = [*FAKE_ARGV, "--out", str(tmp_path), "--jobs", "1"]
    _fake_train(monkeypatch, {"transformer-p400-lr0.01-s0": RuntimeError("out of luck"),
                              "ssm-p400-lr0.01-s0": {"accuracy": 0.625, "steps": 600}})
    assert run_main(argv) == 1
    assert "1 cell(s) failed (see cells/*/error.txt); run again to retry: " \
           "transformer-p400-lr0.01-s0" in capsys.readouterr().err
    summary = json.loads((tmp_path / "cells/ssm-p400-lr0.01-s0/cell.json").read_text())
    assert (summary["accuracy"], summary["loss"], summary["steps"]) == (0.625, 1.25, 600)
    family = registry.get_sweep("expressivity/selective-copying").family
    model, params = size_model(family, "ssm", 400, SelectiveCopyingConfig().vocab_size)
    assert (summary["d_model"], summary["params"]) == (model.d_model, params)
    report = (tmp_path / "selective-copying.md").read_text()
    assert "after 1000 steps (1 of 1 cells stopped early by the time limit, after 600–600 " \
           "steps)" in report
    assert "| Transformer | – | \n" not in report and "| SSM | 0.625 |" in report
    assert "Cells without results (1 of 2; run the sweep again to retry them):\n\n" \
           "- `transformer-p400-lr0.01-s0`: failed: RuntimeError: out of luck\n" in report
    # The retry succeeds: its error.txt goes, the report has both cells and no failure.
    _fake_train(monkeypatch, {"transformer-p400-lr0.01-s0": {"accuracy": 0.25, "steps": 1000}})
    assert run_main(argv) == 0
    assert not list(tmp_path.glob("cells/*/error.txt"))
    report = (tmp_path / "selective-copying.md").read_text()
    assert "| Transformer | 0.250 |" in report and "Cells without results" not in report
    assert "(2 of 2 cells stopped early" not in report and "1 of 2 cells stopped early" in report


def test_a_dead_worker_fails_its_cell_and_the_report_is_still_written(tmp_path, monkeypatch,
                                                                      capsys):
    """A worker killed (e.g. for memory) breaks the pool: the next submit raised
    BrokenProcessPool out of the sweep, with a traceback and no report."""
    import time
    from concurrent.futures.process import BrokenProcessPool

    import hybrid_jax.train

    died = []

    class BreakingPool(_ThreadPool):
        def submit(self, *args):
            if died:
                raise BrokenProcessPool("A child process terminated abruptly")
            return super().submit(*args)

    class Dead(BrokenProcessPool):
        def __init__(self):
            died.append(1)
            super().__init__("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", BreakingPool)
    cells = [f"{a}-p400-lr{lr}-s0" for a in ("transformer", "ssm") for lr in ("0.01", "0.003")]
    outcomes = dict.fromkeys(cells, {"accuracy": 0.5, "steps": 1000})
    _fake_train(monkeypatch, outcomes)
    fake = hybrid_jax.train.train

    def train(experiment, run_dir, **kwargs):
        if run_dir.name == cells[1]:
            raise Dead()
        time.sleep(0.3)  # the second cell dies first
        return fake(experiment, run_dir, **kwargs)

    monkeypatch.setattr(hybrid_jax.train, "train", train)
    argv = [*FAKE_ARGV, "--set", "learning_rates=[0.01,0.003]", "--out", str(tmp_path),
            "--jobs", "2"]
    assert run_main(argv) == 1
    captured = capsys.readouterr()
    assert "a worker process died; 2 cell(s) not started: run again" in captured.out
    assert [p.parent.name for p in tmp_path.glob("cells/*/cell.json")] == [cells[0]]
    report = (tmp_path / "selective-copying.md").read_text()
    assert f"- `{cells[1]}`: failed: " in report and "terminated abruptly" in report
    assert report.count("not run or not finished") == 2


@pytest.mark.parametrize(("setting", "message"), [
    ("budgets=[2e3]", "budgets=[2000.0] holds [2000.0]; expected integers (parameters)"),
    ('budgets=["2k"]', "budgets=['2k'] holds ['2k']; expected integers"),
    ("seeds=[0,1.5]", "seeds=[0, 1.5] holds [1.5]; expected integers"),
    ('learning_rates=[0.01,"0.1"]', "learning_rates=[0.01, '0.1'] holds ['0.1']; expected numbers"),
    ("seeds=[-1]", "TrainConfig.seed=-1: expected an integer >= 0"),
    ("train.seed=1", "train.seed=1 would be replaced in every cell by its seeds value; set "
                     "seeds=[...] instead"),
    ("train.learning_rate=0.1", "train.learning_rate=0.1 would be replaced in every cell by its "
                                "learning_rates value"),
])
def test_grid_settings_that_no_cell_would_use_as_given_are_refused(tmp_path, capsys, setting,
                                                                   message):
    """A float budget made cells "p2000.0" beside the "p2000" ones; a string one raised a bare
    TypeError; train.seed and train.learning_rate were silently replaced in every cell."""
    assert run_main(["expressivity/mqar", "--out", str(tmp_path), "--report-only",
                     "--set", setting]) == 2  # refused as the sweep is built, run or report
    assert message in capsys.readouterr().err


def test_a_damaged_cell_summary_is_named(tmp_path, capsys):
    """A damaged cell.json gave only "Expecting value: line 1 column 1 (char 0)"."""
    path = tmp_path / "cells" / "ssm-p400-lr0.01-s0" / "cell.json"
    path.parent.mkdir(parents=True)
    path.write_text("{")
    assert run_main([*FAKE_ARGV, "--out", str(tmp_path), "--report-only"]) == 2
    assert f"{path} is not valid JSON (" in capsys.readouterr().err


def test_a_cell_evaluates_its_variants_on_its_own_seed(tmp_path, monkeypatch):
    """Each variant: the sweep's data with the variant's changes, the cell's seed and
    train.eval_batches batches; its accuracy and changes go into the summary. A training that
    returns no accuracy is an error, not a cell."""
    import hybrid_jax.data.pipeline
    import hybrid_jax.train
    import hybrid_jax.train.trainer
    from experiments.expressivity.sweep import run_cell

    sweep = Sweep(name="expressivity/x", data=SelectiveCopyingConfig(), budgets=(400,),
                  architectures=("ssm",), seeds=(3,),
                  eval_variants=(("long", (("seq_len", 200),)),))
    cell = sweep.cells()[0]
    _fake_train(monkeypatch, {cell.id: {"accuracy": 0.5, "steps": 1000}})
    read = []

    def eval_batches(data, **kwargs):
        read.append((data, kwargs))
        return "batches"

    def evaluate(ts, batches):
        assert (ts, batches) == ("trained state", "batches")
        return {"accuracy": 0.75}

    monkeypatch.setattr(hybrid_jax.train.trainer, "restore_train_state",
                        lambda experiment, run_dir, mesh: ("trained state", None))
    monkeypatch.setattr(hybrid_jax.data.pipeline, "eval_batches", eval_batches)
    monkeypatch.setattr(hybrid_jax.train, "evaluate", evaluate)
    summary = run_cell(sweep, cell, tmp_path)
    assert (summary["accuracy"], summary["accuracy[long]"]) == (0.5, 0.75)
    assert summary["variants"] == {"long": {"seq_len": 200}}
    assert read == [(SelectiveCopyingConfig(seq_len=200),
                     dict(batch_size=32, num_batches=DEFAULT_TRAIN.eval_batches, seed=3))]
    other = dataclasses.replace(sweep, name="expressivity/y", budgets=(500,))
    _fake_train(monkeypatch, {other.cells()[0].id: {"accuracy": None, "steps": 1000}})
    with pytest.raises(RuntimeError, match=r"cell ssm-p500-lr0.003-s3 did not finish training"):
        run_cell(other, other.cells()[0], tmp_path)


def test_a_cell_a_sibling_sweep_started_is_continued(tmp_path, monkeypatch):
    """Selective copying stopped mid-cell, then its length-generalisation sweep (the same
    models) on that directory: the trainer refused to resume a run of another experiment name
    ("holds a run of 'expressivity/selective-copying/...'"), and the cell failed."""
    import hybrid_jax.train
    from experiments.expressivity.sweep import run_cell
    from hybrid_jax.config import to_dict
    from hybrid_jax.train.run_dir import prepare_run_dir

    copying = Sweep(name="expressivity/copying", data=SelectiveCopyingConfig(), budgets=(400,),
                    architectures=("ssm",))
    lengths = dataclasses.replace(copying, name="expressivity/lengths",
                                  eval_variants=(("long", (("seq_len", 200),)),))
    cell = copying.cells()[0]
    run_dir = tmp_path / "cells" / cell.id
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(copying.experiment(cell)[0])))

    def train(experiment, run_dir, resume, **kwargs):  # the trainer's check of the directory
        assert prepare_run_dir(run_dir, experiment.name, resume=resume, force=False)
        raise RuntimeError("resumed")

    monkeypatch.setattr(hybrid_jax.train, "train", train)
    with pytest.raises(RuntimeError, match="resumed"):
        run_cell(lengths, cell, tmp_path)


def test_two_sweeps_never_work_on_one_cell(tmp_path, monkeypatch):
    """A cell another sweep holds fails at once, naming the lock; both used to write their own
    variants into its cell.json, the later losing the earlier's."""
    import fcntl

    from experiments.expressivity.sweep import run_cell
    from hybrid_jax.train.run_dir import RunDirError

    sweep = Sweep(name="expressivity/x", data=SelectiveCopyingConfig(), budgets=(400,),
                  architectures=("ssm",))
    cell = sweep.cells()[0]
    _fake_train(monkeypatch, {cell.id: {"accuracy": 0.5, "steps": 1000}})
    lock = tmp_path / "cells" / cell.id / "cell.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as other_sweep:
        fcntl.flock(other_sweep, fcntl.LOCK_EX)
        with pytest.raises(RunDirError, match=f"{lock.parent} is in use by another sweep "
                                              r"\(process unknown, lock .*cell.lock\): the next"):
            run_cell(sweep, cell, tmp_path)
    assert run_cell(sweep, cell, tmp_path)["accuracy"] == 0.5  # released: it runs
