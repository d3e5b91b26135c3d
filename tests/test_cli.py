"""The `hybrid-jax` command end to end on a tiny run: train, eval, generate, list, errors."""

import errno
import json
import logging
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from flax import nnx

import experiments.cli as cli
from experiments import registry
from experiments.cli import main
from experiments.run import read_experiment
from hybrid_jax import presets
from hybrid_jax.cache import decode_cache_bytes
from hybrid_jax.config import apply_overrides
from hybrid_jax.flops import step_flops
from hybrid_jax.nn.lm import LanguageModel, count_params

TINY_RUN = ["--set", "train.steps=6", "--set", "train.warmup_steps=2",
            "--set", "train.batch_size=8", "--set", "train.log_every=2",
            "--set", "train.eval_batches=1", "--set", "data.seq_len=16",
            "--set", "data.num_kv_pairs=2", "--set", "train.mesh.data=1", "--set",
            "model.d_model=16", "--set", "model.num_heads=2", "--set", "train.peak_tflops=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "mqar-transformer-tiny", "--out", str(out), "--quiet", *TINY_RUN]) == 0
    return out


def test_train_writes_the_run_directory(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["steps"] == 6 and config["model"]["d_model"] == 16
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [2, 4, 6]
    assert all(x["loss"] > 0 and x["tokens_per_s"] > 0 for x in lines if "loss" in x)
    # MFU by 6N (of record) and by the model count (6N + attention): the second is larger.
    assert all(0 < x["mfu"] < x["mfu_model"] for x in lines if "loss" in x)
    assert all(x["tflops_per_device"] == pytest.approx(x["mfu_model"]) for x in lines
               if "loss" in x)
    # The FLOPs of both steps of a log interval, per device of the mesh's one (of 8), at the
    # count of hybrid_jax.flops (MQAR rows are one document each; test_rates: packed text).
    per_token = step_flops(read_experiment(run_dir / "config.json").model, 16)
    assert all(x["tflops_per_device"] * 1e12 == pytest.approx(
        per_token.training_per_token() * x["tokens_per_s"]) for x in lines if "loss" in x)
    results = json.loads((run_dir / "results.json").read_text())
    assert 0 <= results["accuracy"] <= 1 and results["steps"] == 6
    assert (run_dir / "checkpoints" / "6").is_dir()


def test_eval_reproduces_the_final_metrics(run_dir, capsys):
    results = json.loads((run_dir / "results.json").read_text())
    assert main(["eval", str(run_dir)]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[0])
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"])
    assert metrics["loss"] == pytest.approx(results["eval_loss"], rel=1e-5)
    assert "note:" not in capsys.readouterr().err
    # A model setting other than the checkpoint's (--set here; a resume may change one too).
    assert main(["eval", str(run_dir), "--set", "model.window=4"]) == 0
    assert ("eval: note: model.window differs from what step 6 was trained with (the run's "
            "config.json and --set are used)") in capsys.readouterr().err


def test_eval_with_oryx_modes_reports_attention_tokens_and_cache(tmp_path, capsys):
    """MQAR of 2 pairs in 16 tokens: attention on the 2 scored query tokens = 1/8 of them."""
    out = tmp_path / "oryx"
    assert main(["train", "mqar-oryx-gdn-tiny", "--out", str(out), "--quiet", *TINY_RUN]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--modes", "scored=attention,other=linear"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out.splitlines()[0])
    assert metrics["attention_fraction"] == pytest.approx(2 / 16)
    assert 0 < metrics["cache_kv_bytes"] < metrics["cache_bytes"]
    # The cache of one held-out batch: 8 rows of 16 tokens (train.batch_size, data.seq_len).
    config = read_experiment(out / "config.json").model
    model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
    assert {k: metrics[k] for k in ("cache_bytes", "cache_kv_bytes", "cache_state_bytes")} == \
        decode_cache_bytes(model, 8, 16)
    assert "decode cache for one held-out batch" in captured.err


def test_eval_help_states_what_the_defaults_do():
    """--batches 0 said "the whole held-out split" (a synthetic task's last partial batch is
    left out); --modes named no default (not the schedule of the run's logged evals)."""
    evaluate = cli.build_parser()._subparsers._group_actions[0].choices["eval"]
    helps = {action.dest: action.help for action in evaluate._actions}
    assert "a synthetic task's in whole batches" in helps["batches"]
    assert "default: the blocks' default_mode, not train.mode_schedule" in helps["modes"]


def test_generate_is_greedy_and_deterministic(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt-ids", "3 5 7", "--max-new-tokens", "5"]) == 0
    first = capsys.readouterr().out.split()
    assert len(first) == 5 and all(0 <= int(t) < 256 for t in first)
    main(["generate", str(run_dir), "--prompt-ids", "3,5,7", "--max-new-tokens", "5"])
    assert capsys.readouterr().out.split() == first
    main(["generate", str(run_dir), "--prompt-ids", "3 5 7", "--max-new-tokens", "5",
          "--step", "6"])
    assert capsys.readouterr().out.split() == first


def test_generate_lays_the_run_out_by_its_axis_rules(run_dir, monkeypatch):
    """On a tensor-parallel mesh (generate takes `train.mesh.*`) the default rules split the
    MLP and heads over `tensor`, and `train.mesh.axis_rules=replicated` keeps every parameter
    whole: the rules are the run's, not ignored (they were, before)."""
    import jax

    import hybrid_jax.generate as generation
    from hybrid_jax.config import MeshConfig
    from hybrid_jax.sharding import axis_rules, current_rules

    seen = []
    original = generation.generate

    def recording(model, *args, **kwargs):
        axes = {a for x in jax.tree.leaves(nnx.state(model)) for a in x.sharding.spec}
        seen.append((dict(current_rules()), axes - {None}))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(generation, "generate", recording)
    for rules in ("default", "replicated"):
        assert main(["generate", str(run_dir), "--prompt-ids", "3 5 7", "--max-new-tokens", "2",
                     "--set", "train.mesh.tensor=2",
                     "--set", f"train.mesh.axis_rules={rules}"]) == 0
    assert seen == [(axis_rules(MeshConfig(axis_rules="default")), {"tensor"}),
                    (axis_rules(MeshConfig(axis_rules="replicated")), set())]


@pytest.mark.parametrize("command", [
    ["generate", "--prompt-ids", "3 5 7", "--max-new-tokens", "2"],
    ["convert", "--to", "nha", "--out", "never-written"],
])
def test_generate_and_convert_take_a_checkpoint_step(run_dir, capsys, command):
    name, *rest = command
    assert main([name, str(run_dir), *rest, "--step", "3"]) == 2
    assert (f"checkpoint {run_dir}/checkpoints/3 not found; available steps: [6]"
            in capsys.readouterr().err)


def test_list_shows_presets_blocks_experiments(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("presets:", "transformer-125m", "block types:", "attention", "experiments:",
                 "mqar-transformer-tiny"):
        assert word in out
    # A deep stack of two layer kinds (NHA and full-attention NHA, 24 layers) is counted from
    # stacks of one and two of each: the count of the whole model, built abstractly.
    name = "nha-hybrid-340m"
    config = presets.get(name)
    assert 3 * len(set(config.layers)) < len(config.layers)  # the shortcut applies
    full = count_params(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))
    assert cli._param_count(name) == full
    assert f"  {name:32s} {full / 1e6:8.2f}M  {presets.describe(name)}" in out.splitlines()


def test_list_keeps_long_experiment_and_sweep_names_apart_from_their_descriptions(
        monkeypatch, capsys):
    """At a fixed 32 / 36-character column, `lm-wikitext2-baseline-transformer-tiny` and
    `expressivity/mkar-length-generalisation` ran into their descriptions with one space."""
    monkeypatch.setattr(cli, "_param_count", lambda name: 0)  # presets are not the point
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for header, names in (("experiments:", registry.names()),
                          ("sweeps (python", registry.sweep_names())):
        start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 1
        rows = lines[start:start + len(names)]
        assert [row.split()[0] for row in rows] == names
        pairs = list(zip(rows, names, strict=True))
        starts = {len(row) - len(row[2 + len(name):].lstrip()) for row, name in pairs}
        assert len(starts) == 1, starts  # every description starts in one column
        assert all(row[2 + len(name):].startswith("  ") for row, name in pairs)


def test_param_count_of_a_deep_stack_of_two_layer_kinds(monkeypatch):
    """Mamba-2 and attention layers (of different sizes) alternating, 8 deep: the shortcut's
    count is the whole model's."""
    tiny = presets.get("mamba2-hybrid-tiny")
    deep = tiny.replace(layers=tiny.layers * 4)
    original = presets.get
    monkeypatch.setattr(presets, "get", lambda name: deep if name == "deep" else original(name))

    def abstract_count(config) -> int:
        return count_params(nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0))))

    mamba2, attention = (abstract_count(tiny.replace(layers=(spec,))) for spec in tiny.layers)
    assert mamba2 != attention and 3 * len(set(deep.layers)) < len(deep.layers)
    assert cli._param_count.__wrapped__("deep") == abstract_count(deep)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["train", "mqar-transformer-tiny", "--set", "model.num_heads=5"],
         "num_heads=5 does not divide d_model=64"),
        (["eval", "/nonexistent/run"], "config.json not found"),
        (["eval", "/nonexistent/run", "--layers", "0"], "--layers only apply with --windows"),
        (["eval", "/nonexistent/run", "--sweep-out", "x"], "--sweep-out only apply with --windows"),
        (["eval", "/nonexistent/run", "--windows", "4", "--modes", "linear"],
         "--modes and --windows: the window sweep runs the model's own modes"),
        (["train", "mqar-transformer-tiny", "--set", "data.vocab_size=512"],
         "data.vocab_size=512 exceeds model.vocab_size=256"),
        (["train", "mqar-transformer-tiny", "--set", "train.batch_size=4", "--set",
          "train.mesh.data=2", "--set", "train.mesh.fsdp=4"],
         "train.batch_size=4 does not split over the mesh's batch axes (data 2 x fsdp 4 = 8 "
         "shards)"),
        (["train", "mqar-transformer-tiny", "--local-device-ids", "0,x"],
         "--local-device-ids expects integers, got 'x'"),
        (["scale", "mqar-transformer-tiny", "--devices", "1,x"],
         "--devices expects integers, got 'x'"),
        (["scale", "mqar-transformer-tiny", "--steps", "0"],
         "--steps=0: expected a finite value >= 1"),  # it compiled, then had no median
        (["scale", "mqar-transformer-tiny", "--time-limit", "-1"],
         "--time-limit=-1.0: expected a finite value >= 0"),
        (["scale", "mqar-transformer-tiny", "--time-limit", "inf"],
         "--time-limit=inf: expected a finite value >= 0"),
        (["scale", "mqar-transformer-tiny", "--devices", "2,0"],
         "--devices: expected positive counts, got '2,0'"),
        # The mesh's errors named MeshConfig and "lower train.mesh.data / fsdp / ...".
        (["import", "hf", "/nonexistent", "--out", "x", "--fsdp", "9"],
         "--fsdp=9: expected 1 to 8 (the devices available), or -1 for all of them; on a CPU, "
         "set XLA_FLAGS=--xla_force_host_platform_device_count=9 before starting"),
        (["import", "hf", "/nonexistent", "--out", "x", "--fsdp", "0"], "--fsdp=0: expected 1"),
    ],
)
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_an_interrupted_train_exits_128_plus_the_signal(monkeypatch, capsys):
    """The checkpoint is saved; the exit status says which signal stopped it (SIGTERM: 143),
    and the line names the default run directory runs/NAME to resume in."""
    calls = []

    def stopped(name, *, out_dir, **kwargs):
        calls.append(out_dir)
        return {"interrupted": "SIGTERM", "step": 3}

    monkeypatch.setattr("experiments.run.run_experiment", stopped)
    assert main(["train", "mqar-transformer-tiny", "--quiet"]) == 143
    assert calls == [Path("runs") / "mqar-transformer-tiny"]
    assert capsys.readouterr().out == (
        "SIGTERM at step 3: checkpoint saved in runs/mqar-transformer-tiny; continue with: "
        "hybrid-jax train mqar-transformer-tiny --out runs/mqar-transformer-tiny --resume\n")


def test_run_experiment_resumes_the_saved_config_unless_forced(tmp_path, monkeypatch):
    """`resume`: the run directory's config.json plus the overrides, refused when it holds
    another experiment; `force`: the registered experiment (plus the overrides) instead."""
    import experiments.run as run
    from hybrid_jax.config import to_dict

    trained = []
    monkeypatch.setattr("hybrid_jax.train.train", lambda experiment, out_dir, **kwargs:
                        trained.append((experiment, kwargs)) or {})
    saved = apply_overrides(registry.get("mqar-transformer-tiny"), ["train.steps=700"])
    (tmp_path / "config.json").write_text(json.dumps(to_dict(saved)))
    run.run_experiment("mqar-transformer-tiny", out_dir=tmp_path, resume=True, progress=False,
                       overrides=["train.batch_size=4"])
    assert trained[-1][0] == apply_overrides(saved, ["train.batch_size=4"])
    assert trained[-1][1] == dict(progress=False, resume=True, force=False)
    run.run_experiment("mqar-transformer-tiny", out_dir=tmp_path, resume=True, force=True,
                       progress=False, overrides=["train.batch_size=4"])
    assert trained[-1][0] == apply_overrides(registry.get("mqar-transformer-tiny"),
                                             ["train.batch_size=4"])
    with pytest.raises(ValueError, match=r"holds a run of 'mqar-transformer-tiny', not "
                                         r"'mqar-gdn-tiny': continue it with `hybrid-jax train "
                                         r"mqar-transformer-tiny --out .* --resume`"):
        run.run_experiment("mqar-gdn-tiny", out_dir=tmp_path, resume=True, progress=False)


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{", "is not valid JSON"), (b"{oops", "is not valid JSON"),
    (b'{"name": "x", "model": 3}', "does not describe an experiment"),
    (b'{"name": "x", "model": {"layers": 3}}', "does not describe an experiment"),
    (b'{"name": "x", "modle": {}}', "does not describe an experiment")])
def test_read_experiment_names_a_damaged_config(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{path}.*{message}"):
        read_experiment(path)


def test_ctrl_c_exits_130_and_the_thread_hook_is_restored(monkeypatch, capsys):
    hooks = []

    def interrupted(args):
        hooks.append(threading.excepthook)
        raise KeyboardInterrupt

    before = threading.excepthook
    monkeypatch.setitem(cli.COMMANDS, "list", interrupted)
    assert main(["list"]) == 130
    assert capsys.readouterr().err == "hybrid-jax list: interrupted\n"
    assert hooks[0] is not before and threading.excepthook is before
    monkeypatch.setitem(cli.COMMANDS, "list", lambda args: 0)
    assert main(["list"]) == 0 and threading.excepthook is before
    # Debugging: tracebacks everywhere, so neither the thread hook nor Ctrl-C is touched.
    monkeypatch.setenv("HYBRID_JAX_DEBUG", "1")
    monkeypatch.setitem(cli.COMMANDS, "list", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["list"])
    assert hooks[1] is before and threading.excepthook is before


def test_a_closed_pipe_exits_quietly_as_sigpipe(monkeypatch, capsys):
    """`hybrid-jax generate ... | head -1`: the reader leaves; the writer ends with 141 (128 +
    SIGPIPE) and says nothing, and the exit's flush of stdout raises no second error."""
    read, write = os.pipe()
    os.close(read)
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)

    def prints(args):
        print("a continuation", flush=True)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "list", prints)
    assert main(["list"]) == 141
    assert capsys.readouterr().err == ""
    print("buffered", file=stdout)
    stdout.close()  # flushes into /dev/null now: no BrokenPipeError


def _logs(args):
    logging.getLogger("hybrid_jax.dispatch").info("attention: ran the pallas rung")
    return 0


def test_the_command_prints_the_library_logs_with_level_and_logger(monkeypatch, capsys):
    """INFO by default (which rung ran), one line naming logger and level; --log-level or
    HYBRID_JAX_LOG_LEVEL raises it. Importing the library configures no logging, and the
    command leaves the logger as it found it."""
    logger = logging.getLogger("hybrid_jax")
    untouched = ([], logging.NOTSET, True)
    assert (logger.handlers, logger.level, logger.propagate) == untouched
    monkeypatch.delenv("HYBRID_JAX_LOG_LEVEL", raising=False)
    monkeypatch.setitem(cli.COMMANDS, "list", _logs)
    assert main(["list"]) == 0
    assert capsys.readouterr().err == "hybrid_jax.dispatch INFO: attention: ran the pallas rung\n"
    assert (logger.handlers, logger.level, logger.propagate) == untouched
    assert main(["--log-level", "warning", "list"]) == 0 and capsys.readouterr().err == ""
    monkeypatch.setenv("HYBRID_JAX_LOG_LEVEL", "WARNING")
    assert main(["list"]) == 0 and capsys.readouterr().err == ""
    assert main(["--log-level", "debug", "list"]) == 0 and "INFO" in capsys.readouterr().err
    monkeypatch.setenv("HYBRID_JAX_LOG_LEVEL", "loud")
    assert main(["list"]) == 2
    assert capsys.readouterr().err == ("hybrid-jax list: error: HYBRID_JAX_LOG_LEVEL='loud': "
                                       "expected one of debug, info, warning, error\n")


def _script_main():
    logging.getLogger("hybrid_jax.dispatch").info("attention: fell back to the xla rung")
    return 3


def test_scripts_print_the_library_logs_as_the_command_does(monkeypatch, capsys):
    """A benchmark or experiment script's main, run by run_with_logging, prints the INFO
    records (which rung ran) on stderr and keeps main's result (the exit status);
    HYBRID_JAX_LOG_LEVEL quiets them; a bad level is refused, naming the levels, before main."""
    monkeypatch.delenv("HYBRID_JAX_LOG_LEVEL", raising=False)
    assert cli.run_with_logging(_script_main) == 3
    assert capsys.readouterr().err == ("hybrid_jax.dispatch INFO: attention: fell back to the "
                                       "xla rung\n")
    assert logging.getLogger("hybrid_jax").handlers == []
    monkeypatch.setenv("HYBRID_JAX_LOG_LEVEL", "warning")
    assert cli.run_with_logging(_script_main) == 3 and capsys.readouterr().err == ""
    monkeypatch.setenv("HYBRID_JAX_LOG_LEVEL", "loud")
    monkeypatch.setattr(sys, "argv", ["/x/experiments/benchmarks/train_throughput.py"])
    with pytest.raises(SystemExit) as exit_:
        cli.run_with_logging(lambda: pytest.fail("main ran"))
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("train_throughput.py: error: HYBRID_JAX_LOG_LEVEL='loud': "
                                       "expected one of debug, info, warning, error\n")


def test_every_script_main_runs_with_the_library_logs():
    """No benchmark or experiment script drops the rung records: each `__main__` block under
    experiments/ calls run_with_logging (cli.py sets up its own; the torch peers import no jax)."""
    root = Path(cli.__file__).parent
    scripts = {path: path.read_text().partition('\nif __name__ == "__main__":\n')[2]
               for path in root.rglob("*.py")
               if "peers" not in path.parts and path.name != "cli.py"}
    blocks = {path: block for path, block in scripts.items() if block}
    assert len(blocks) >= 29
    assert [str(p) for p, block in blocks.items() if "run_with_logging(main)" not in block] == []


def test_logging_setup_nested_keeps_one_handler():
    logger = logging.getLogger("hybrid_jax")
    with cli.logging_to_stderr("info"):
        with cli.logging_to_stderr("warning"):
            assert len(logger.handlers) == 1 and logger.level == logging.WARNING
        assert len(logger.handlers) == 1
    assert logger.handlers == []


def test_only_process_0_of_a_multi_process_run_prints_info_by_default(monkeypatch, capsys):
    def trained(name, **kwargs):
        _logs(None)
        return {"accuracy": 1.0}

    monkeypatch.delenv("HYBRID_JAX_LOG_LEVEL", raising=False)
    monkeypatch.setattr("hybrid_jax.distributed.initialize", lambda *args, **kwargs: True)
    monkeypatch.setattr("hybrid_jax.distributed.is_main_process", lambda: False)
    monkeypatch.setattr("experiments.run.run_experiment", trained)
    assert main(["train", "mqar-transformer-tiny", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--log-level", "info", "train", "mqar-transformer-tiny", "--quiet"]) == 0
    assert "hybrid_jax.dispatch INFO" in capsys.readouterr().err
    monkeypatch.setattr("hybrid_jax.distributed.is_main_process", lambda: True)
    assert main(["train", "mqar-transformer-tiny", "--quiet"]) == 0
    assert "hybrid_jax.dispatch INFO" in capsys.readouterr().err


@pytest.mark.parametrize("error, line", [
    # Ours: multi-line text (a listing) is kept whole, on one line.
    (ValueError("two problems:\nfirst\nsecond"), "two problems: first second"),
    (FileNotFoundError("runs/x/config.json not found"), "runs/x/config.json not found"),
    (OSError(errno.ENOSPC, "No space left on device"), "I/O error (disk full): No space left on "
                                                       "device"),
    (PermissionError(errno.EACCES, "Permission denied", "/ro/metrics.jsonl"),
     "I/O error: Permission denied: /ro/metrics.jsonl"),
    (OSError("tensorstore: write failed\ndump"), "tensorstore: write failed dump"),  # no errno
    (KeyError("k"), "unexpected KeyError: 'k' (set HYBRID_JAX_DEBUG=1 for the traceback)"),
    (RuntimeError(), "unexpected RuntimeError:  (set HYBRID_JAX_DEBUG=1 for the traceback)"),
])
def test_error_line(error, line):
    assert cli.error_line(error) == line


def test_train_of_a_sweep_names_the_sweep_command(capsys):
    """`hybrid-jax list` shows sweeps beside experiments; `train SWEEP` said "unknown
    experiment" and listed the experiments only."""
    assert main(["train", "expressivity/mqar"]) == 2
    assert ("'expressivity/mqar' is a sweep (a grid of runs), not an experiment: run it with "
            "`python -m experiments.run expressivity/mqar --out DIR`") in capsys.readouterr().err


def test_prompt_file_skips_blank_lines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("the cat\n\n   \nsat on\n", encoding="utf-8")
    assert cli._prompts(SimpleNamespace(prompt=None, prompt_file=path)) == ["the cat", "sat on"]
    path.write_text("\n \n")
    with pytest.raises(ValueError, match="prompts.txt has no non-empty line"):
        cli._prompts(SimpleNamespace(prompt=None, prompt_file=path))


def test_prompt_file_drops_a_byte_order_mark(tmp_path):
    """A UTF-8 file saved with a byte order mark (Notepad, PowerShell) fed the mark's three
    bytes to the model as the start of the first prompt."""
    path = tmp_path / "prompts.txt"
    path.write_bytes("\ufeffthe cat\r\nsat on\r\n".encode())
    assert cli._prompts(SimpleNamespace(prompt=None, prompt_file=path)) == ["the cat", "sat on"]


def test_stop_strings_read_the_backslash_escapes_a_shell_passes_through():
    """`--stop "\\n\\n"` (the README's example) reaches the program as backslash-n twice; it
    was matched literally, so generation never stopped at a blank line."""
    assert cli._stop_strings(["\\n\\n", "a\\tb\\r", "C:\\\\x", "\\d+", "plain"]) == [
        "\n\n", "a\tb\r", "C:\\x", "\\d+", "plain"]
    args = cli.build_parser().parse_args(["generate", "r", "--prompt", "p", "--stop", "\\n\\n"])
    assert cli._stop_strings(args.stop) == ["\n\n"]


@pytest.mark.parametrize("hf, gen, limits", [
    # generation_config.json's eos ids replace config.json's (as in transformers); the
    # tokenizer's EOS always ends a row too.
    ({"eos_token_id": 2, "max_position_embeddings": 64}, {"eos_token_id": [7, 5]},
     (64, [5, 7, 9])),
    ({"eos_token_id": 2}, None, (None, [2, 9])),
    ({"eos_token_id": [3, 4]}, {"bos_token_id": 1}, (None, [3, 4, 9])),
    ({"eos_token_id": 9}, {"eos_token_id": 9}, (None, [9])),
    (None, None, (None, [9])),  # a trained run: neither file
])
def test_generation_limits_of_an_imported_run(tmp_path, hf, gen, limits):
    for name, content in (("hf_config.json", hf), ("generation_config.json", gen)):
        if content is not None:
            (tmp_path / name).write_text(json.dumps(content))
    assert cli._generation_limits(tmp_path, SimpleNamespace(eos_id=9)) == limits


def test_a_run_without_its_first_checkpoint_yet_says_what_was_found(tmp_path, capsys):
    """eval of a run still training before its first save said only 'no checkpoint found':
    now what is there (config, metrics), whether its training runs (the run lock) and when a
    save comes (train.checkpoint_every), and nothing is created there."""
    from hybrid_jax.config import to_dict
    from hybrid_jax.train.metrics import MetricsLog
    from hybrid_jax.train.run_dir import RunLock

    saved = apply_overrides(registry.get("mqar-transformer-tiny"), ["train.checkpoint_every=50"])
    (tmp_path / "config.json").write_text(json.dumps(to_dict(saved)))
    MetricsLog(tmp_path, tensorboard=False).write({"step": 10, "loss": 2.5})
    with RunLock(tmp_path):
        assert main(["eval", str(tmp_path)]) == 2
    running = capsys.readouterr().err.strip()
    assert main(["eval", str(tmp_path)]) == 2
    stopped = capsys.readouterr().err.strip()
    found = (f"no checkpoint found in {tmp_path}: it holds its config.json and metrics logged "
             f"up to step 10, but {tmp_path / 'checkpoints'} does not exist; ")
    saves = "(a run saves every train.checkpoint_every=50 steps and at its end)"
    assert running.endswith(found + f"its training is running (process {os.getpid()}) and has "
                            f"not saved its first checkpoint yet {saves}: wait for that save")
    assert stopped.endswith(found + "no training is running there: it stopped before its first "
                            f"checkpoint {saves}, or none started; train it again with "
                            f"hybrid-jax train mqar-transformer-tiny --out {tmp_path} --resume")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "config.json",
                                                          "metrics.jsonl"]
    # An import writing the directory holds the same lock: said as what it is, not a training.
    with RunLock(tmp_path, activity="writing the model of /models/llama"):
        assert main(["eval", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        found + f"process {os.getpid()} is writing the model of /models/llama there and has "
        "not saved it yet: wait for it to finish")
