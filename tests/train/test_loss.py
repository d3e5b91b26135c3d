"""train.loss: the custom-gradient cross entropy equals the plain one bit for bit (float32)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.train.loss import mean_loss, token_stats


def plain_token_stats(logits_BTV, targets_BT, mask_BT):
    """The loss as written before its custom gradient: logsumexp, take_along_axis, argmax."""
    logits = logits_BTV.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets_BT[..., None], axis=-1)[..., 0]
    weights = mask_BT.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == targets_BT).astype(jnp.float32)
    return {"loss_sum": jnp.sum((log_z - target_logit) * weights),
            "correct": jnp.sum(correct * weights), "count": jnp.sum(weights)}


def _batch(batch=3, length=19, vocab=101):
    """Logits with a tie for the maximum and a -inf column, targets (some predicted, one of
    them at an unscored position), and the mask of packed rows: no target across a document
    boundary, padding at the end."""
    rng = np.random.default_rng(0)
    logits = 4 * rng.standard_normal((batch, length, vocab)).astype(np.float32)
    logits[0, 3, [7, 9]] = logits[0, 3].max() + 1
    logits[:, :, 5] = -np.inf
    targets = rng.integers(6, vocab, (batch, length)).astype(np.int32)  # never the -inf one
    targets[1, :4] = logits[1, :4].argmax(-1)
    targets[1, 5] = logits[1, 5].argmax()  # a document's last token: not scored
    segments = np.arange(length) // 6
    mask = np.tile(np.append(segments[1:] == segments[:-1], False), (batch, 1))
    mask[-1, -3:] = False
    return jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask)


def _stats_and_grads(stats_fn, logits, targets, mask):
    loss = lambda logits, weights: mean_loss(stats_fn(logits, targets, weights))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(logits, mask.astype(jnp.float32))
    return jax.jit(stats_fn)(logits, targets, mask), grads


def test_values_and_gradients_equal_the_plain_loss_exactly():
    logits, targets, mask = _batch()
    stats, grads = _stats_and_grads(token_stats, logits, targets, mask)
    plain_stats, plain_grads = _stats_and_grads(plain_token_stats, logits, targets, mask)
    assert 0 < float(stats["correct"]) < float(stats["count"]) < mask.size
    predicted = np.asarray(jnp.argmax(logits, -1) == targets)
    assert np.any(predicted & ~np.asarray(mask))  # so a count that ignored the mask would show
    for key in stats:
        assert float(stats[key]) == float(plain_stats[key]), key
    for got, want in zip(grads, plain_grads, strict=True):  # logits, then the weights
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.any(np.asarray(grads[0])[~np.asarray(mask)])  # unscored rows get nothing
    for bad in (mask[:, :1], mask[0]):  # both broadcast against (3, 19): a wrong count
        with pytest.raises(ValueError, match=re.escape(
                f"mask must have the targets' shape (3, 19), got {tuple(bad.shape)}")):
            token_stats(logits, targets, bad)
    # Unscored targets outside the vocabulary (-100, -1000 padding; 101) are never read: the
    # same loss and logit gradient (-1000 and 101 made it NaN, at least outside jit); a scored
    # negative one gives NaN (-100 read the logit of word 1), not a quiet number.
    padded = jnp.where(mask, targets, jnp.asarray([-100, -1000, 101])[jnp.arange(19) % 3])
    padded_stats, padded_grads = _stats_and_grads(token_stats, logits, padded, mask)
    for key in stats:
        assert float(padded_stats[key]) == float(stats[key]), key
    np.testing.assert_array_equal(np.asarray(padded_grads[0]), np.asarray(grads[0]))
    eager, eager_padded = (token_stats(logits, t, mask)["loss_sum"] for t in (targets, padded))
    assert float(eager_padded) == float(eager)
    scored = mask.at[0, 2].set(True)
    assert np.isnan(float(token_stats(logits, targets.at[0, 2].set(-100), scored)["loss_sum"]))


def test_bfloat16_logits_are_upcast_like_the_plain_loss():
    """bf16 logits (a model's compute dtype) are upcast before the sums: values and the bf16
    logit gradient equal the plain loss's on the same logits, bit for bit."""
    logits, targets, mask = _batch()
    logits = logits.astype(jnp.bfloat16)
    stats, grads = _stats_and_grads(token_stats, logits, targets, mask)
    plain_stats, plain_grads = _stats_and_grads(plain_token_stats, logits, targets, mask)
    for key in stats:
        assert float(stats[key]) == float(plain_stats[key]), key
    assert grads[0].dtype == jnp.bfloat16
    for got, want in zip(grads, plain_grads, strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("loss_sum,count,mean", [(6.0, 4.0, 1.5), (2.5, 1.0, 2.5),
                                                  (0.0, 0.0, 0.0)])
def test_mean_loss_is_the_sum_over_the_scored_count(loss_sum, count, mean):
    """The logged loss: Σ over scored tokens / their count; a batch with none scores 0, not
    NaN."""
    stats = {"loss_sum": jnp.float32(loss_sum), "count": jnp.float32(count)}
    assert float(mean_loss(stats)) == mean


def test_correct_count_gradient_reaches_the_weights_only():
    logits, targets, mask = _batch()
    weights = mask.astype(jnp.float32)
    for stats_fn in (token_stats, plain_token_stats):
        correct = lambda l, w, stats_fn=stats_fn: stats_fn(l, targets, w)["correct"]
        d_logits, d_weights = jax.jit(jax.grad(correct, argnums=(0, 1)))(logits, weights)
        assert not np.any(np.asarray(d_logits))
        np.testing.assert_array_equal(
            np.asarray(d_weights), np.asarray(jnp.argmax(logits, -1) == targets, np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_nan_logits_give_a_nan_loss_like_the_plain_one(dtype):
    logits, targets, mask = _batch()
    logits = logits.at[0, 2, 11].set(jnp.nan).astype(dtype)  # one NaN: a NaN loss
    stats = token_stats(logits, targets, mask)
    plain = plain_token_stats(logits, targets, mask)
    assert np.isnan(float(stats["loss_sum"])) and np.isnan(float(plain["loss_sum"]))
    assert float(stats["correct"]) == float(plain["correct"])


def test_non_finite_rows_give_what_the_plain_loss_gives():
    """A row whose maximum is +inf, all −inf, or holding NaNs (the first NaN is the argmax, as
    in `jnp.argmax`), and one that ties at the maximum: the loss and the correct count are the
    plain loss's, each row on its own (a NaN row makes any sum over rows NaN)."""
    rng = np.random.default_rng(1)
    base = jnp.asarray(rng.standard_normal(9), jnp.float32)
    rows = {"+inf at 3": base.at[3].set(jnp.inf),
            "all -inf": jnp.full(9, -jnp.inf),
            "NaN at 2 and 6": base.at[6].set(jnp.nan).at[2].set(jnp.nan),
            "tie at 1 and 7": base.at[1].set(5.0).at[7].set(5.0)}
    one = jnp.ones((1, 1), bool)
    for name, row in rows.items():
        first_best = int(jnp.argmax(row))
        for target in (first_best, 7, 0):
            targets = jnp.full((1, 1), target, jnp.int32)
            got = token_stats(row[None, None], targets, one)
            want = plain_token_stats(row[None, None], targets, one)
            for key in ("loss_sum", "correct"):
                np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]),
                                              err_msg=f"{name}, target {target}: {key}")
    assert int(jnp.argmax(rows["NaN at 2 and 6"])) == 2
