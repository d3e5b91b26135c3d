"""The plain progress line (CI, pipes): its fields and an ETA from this run's own steps;
messages and the bar's rollback."""

from hybrid_jax.train import metrics
from hybrid_jax.train.metrics import Progress


def test_eta_counts_only_the_steps_this_process_ran(monkeypatch, capsys):
    """Resumed at step 10 of 110: 20 steps in 40 s leave 80 steps, 160 s."""
    now = [100.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
    progress = Progress(total=110, initial=10)
    assert progress.eta(10) == "?"  # no step run yet
    now[0] = 140.0
    assert progress.eta(30) == "00:02:40"
    progress.log(30, {"loss": 1.23456, "tokens_per_s": 51234.0})
    assert capsys.readouterr().out == "step 30/110 loss=1.235 tokens_per_s=5.123e+04 eta=00:02:40\n"
    Progress(total=5, enabled=False).log(1, {"loss": 1.0})
    assert capsys.readouterr().out == ""


def test_messages_go_to_stdout_unless_disabled_and_set_moves_the_bar(capsys):
    """`message` prints a line on stdout (not stderr, the bar's stream) when enabled and
    nothing when disabled; `set` (a rollback) moves the bar back to the step."""
    progress = Progress(total=10)
    progress.message("rolled back to step 4")
    progress.set(4)
    assert progress.bar.n == 4
    Progress(total=10, enabled=False).message("hidden")
    assert capsys.readouterr() == ("rolled back to step 4\n", "")
