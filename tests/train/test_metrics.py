"""Run outputs: which values of a record become TensorBoard scalars, under which tag and step;
`tensorboard=False` makes no writer; a directory without `metrics.jsonl` is named."""

import json
import math

import pytest

from hybrid_jax.train.metrics import MetricsLog, read_metrics, read_results, write_results


class Scalars:
    """Stands in for tensorboardX's writer: records each `add_scalar` as (tag, value, step)."""

    def __init__(self):
        self.added, self.flushes = [], 0

    def add_scalar(self, tag, value, step=None):
        self.added.append((tag, value, step))

    def flush(self):
        self.flushes += 1

    def close(self):
        pass


def test_finite_numbers_become_train_or_eval_scalars_at_the_records_step(tmp_path):
    """Floats and ints are logged at the record's step, `eval_X` as `eval/X` and the rest as
    `train/X`; the step itself, strings and non-finite values are not (the JSON line keeps
    them all), and each write is flushed. Event records (a rollback's `to_step`, a time
    limit's `seconds`) are history in the JSON lines, not TensorBoard curves."""
    log = MetricsLog(tmp_path)
    assert log.writer is not None
    log.writer.close()
    log.writer = Scalars()
    record = {"step": 7, "loss": 2.5, "tokens": 4096, "eval_loss": 3.0, "evals_run": 1,
              "grad_norm": math.inf, "eval_accuracy": math.nan, "note": "resumed"}
    log.write(record)
    assert log.writer.added == [("train/loss", 2.5, 7), ("train/tokens", 4096, 7),
                                ("eval/loss", 3.0, 7), ("train/evals_run", 1, 7)]
    assert log.writer.flushes == 1
    assert read_metrics(tmp_path) == [{**record, "eval_accuracy": pytest.approx(math.nan,
                                                                                nan_ok=True)}]
    assert log.history == [record]
    log.write({"step": 8, "event": "rollback", "to_step": 4, "message": "loss is nan"})
    assert len(log.writer.added) == 4


def test_tensorboard_off_makes_no_writer(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": 1.0})
    assert log.writer is None and not (tmp_path / "tensorboard").exists()
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 1.0}]


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"metrics.jsonl not found: is .* a run "
                                                r"directory\?"):
        read_metrics(tmp_path)


def _refuse(constant):
    raise ValueError(f"{constant} is not JSON")


def test_non_finite_values_are_written_as_strict_json_and_read_back(tmp_path):
    """NaN and ±inf were written as bare `NaN` / `Infinity`, which strict JSON parsers (jq,
    JavaScript's JSON.parse) refuse: now as the strings "NaN", "Infinity", "-Infinity", read
    back as floats, in appended lines and in those a truncate writes again."""
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "loss": math.nan, "grad_norm": math.inf, "eval_perplexity": -math.inf,
               "note": "ok"})
    log.write({"step": 2, "loss": 2.5})
    log.truncate(1)
    log.write({"step": 2, "loss": 2.25, "diag": [math.nan, 1.0]})
    lines = log.path.read_text().splitlines()
    assert [json.loads(line, parse_constant=_refuse) for line in lines] == [
        {"step": 1, "loss": "NaN", "grad_norm": "Infinity", "eval_perplexity": "-Infinity",
         "note": "ok"},
        {"step": 2, "loss": 2.25, "diag": ["NaN", 1.0]}]
    first, second = read_metrics(tmp_path)
    assert math.isnan(first["loss"]) and math.isnan(second["diag"][0])
    assert (first["grad_norm"], first["eval_perplexity"]) == (math.inf, -math.inf)
    assert (first["note"], second["loss"], second["diag"][1]) == ("ok", 2.25, 1.0)


def test_results_are_strict_json_and_read_back(tmp_path):
    """results.json with an infinite perplexity (a diverged run) was bare `Infinity`."""
    write_results(tmp_path, {"eval_perplexity": math.inf, "eval_loss": math.nan, "steps": 3})
    text = (tmp_path / "results.json").read_text()
    assert json.loads(text, parse_constant=_refuse)["eval_perplexity"] == "Infinity"
    results = read_results(tmp_path)
    assert results["eval_perplexity"] == math.inf and math.isnan(results["eval_loss"])
    assert results["steps"] == 3 and list(tmp_path.iterdir()) == [tmp_path / "results.json"]


def test_truncate_keeps_records_to_the_step_and_every_event(tmp_path):
    """A resumed run drops the records past its checkpoint (a torn last line too) from the
    file and its history, and keeps the events."""
    log = MetricsLog(tmp_path, tensorboard=False)
    for record in ({"step": 1}, {"step": 2}, {"step": 3, "event": "rollback"}, {"step": 3}):
        log.write(record)
    with log.path.open("a") as f:
        f.write('{"step": 4, "lo')  # killed mid-write
    log.truncate(2)
    assert read_metrics(tmp_path) == log.history == [{"step": 1}, {"step": 2},
                                                     {"step": 3, "event": "rollback"}]


def tensorboard_events(run_dir):
    """The events of `RUN_DIR/tensorboard`, files in name order (as TensorBoard reads them)."""
    from tensorboardX.proto.event_pb2 import Event

    for path in sorted((run_dir / "tensorboard").iterdir()):
        data, at = path.read_bytes(), 0
        while at < len(data):  # TFRecords: u64 length, u32 crc, payload, u32 crc
            length = int.from_bytes(data[at:at + 8], "little")
            yield Event.FromString(data[at + 12:at + 12 + length])
            at += 16 + length


def is_restart(event):
    """tensorboardX's `purge_step` marker (`SessionLog.START`)."""
    return event.session_log.status == event.session_log.START


def shown_by_tensorboard(run_dir):
    """{tag: [(step, value)]} as TensorBoard shows them: a restart marker at step s drops every
    point read before it at a step >= s."""
    points = {}
    for event in tensorboard_events(run_dir):
        if is_restart(event):
            points = {tag: [p for p in ps if p[0] < event.step] for tag, ps in points.items()}
        for value in event.summary.value:
            points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return points


def test_steps_logged_again_after_a_resume_or_rollback_draw_one_curve(tmp_path):
    """A run logged to step 3; it resumes from step 1 (a later process) and rolls back to step
    2 (in the process): TensorBoard shows each step once, with the value logged last."""
    first = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        first.write({"step": step, "loss": float(step)})
    first.close()
    resumed = MetricsLog(tmp_path)
    resumed.truncate(1)
    for step in (2, 3):
        resumed.write({"step": step, "loss": 10.0 + step})
    resumed.truncate(2)
    resumed.write({"step": 3, "loss": 20.0})
    resumed.close()
    assert shown_by_tensorboard(tmp_path) == {"train/loss": [(1, 1.0), (2, 12.0), (3, 20.0)]}
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0, 12.0, 20.0]


def test_a_fresh_run_writes_no_restart_marker(tmp_path):
    """Nothing to purge before a run's first record: its events are its scalars only."""
    log = MetricsLog(tmp_path)
    log.truncate(0)
    log.write({"step": 1, "loss": 1.0})
    log.close()
    assert not any(is_restart(e) for e in tensorboard_events(tmp_path))
    assert shown_by_tensorboard(tmp_path) == {"train/loss": [(1, 1.0)]}
