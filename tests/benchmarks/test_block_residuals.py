"""`experiments/benchmarks/block_residuals.py`: per-token bytes of what a block's backward keeps."""

from experiments.benchmarks.block_residuals import block_residuals, main
from hybrid_jax import presets


def test_counts_the_block_input_and_no_float32_copy_in_a_transformer_block(tmp_path):
    rows = block_residuals("transformer-tiny", length=16)
    d_model = presets.get("transformer-tiny").d_model
    by_source = {(r["source"], r["dtype"]): r for r in rows}
    assert by_source[("argument", "bf16")]["bytes_per_token"] == 2 * d_model  # x, bf16
    # RMSNorm, SwiGLU and attention keep bf16 only (RoPE's float32 tables are per position)
    wide_f32 = [r for r in rows if r["dtype"] == "f32" and r["bytes_per_token"] >= 4 * d_model]
    assert not wide_f32, wide_f32
    assert rows == sorted(rows, key=lambda r: -r["bytes_per_token"])
    assert main(["--models", "transformer-tiny", "--length", "16",
                 "--out", str(tmp_path / "r.json")]) == 0
