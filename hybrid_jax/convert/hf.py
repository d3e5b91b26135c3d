"""`hybrid-jax import hf DIR --out RUN_DIR` and `hybrid-jax export hf RUN_DIR --out DIR`.

A Hugging Face directory (`config.json`, `model.safetensors` or shards + index,
`tokenizer.json`, optionally `tokenizer_config.json` / `generation_config.json`) becomes a run
directory, and back. The imported `config.json` is kept as `RUN_DIR/hf_config.json`: export
starts from it (token ids, max positions), and generation reads the model's position limit
from it. Round trip: export → import gives the same parameters, bit for bit.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from jax.sharding import Mesh

from hybrid_jax.config import ExperimentConfig, ModelConfig
from hybrid_jax.convert.hf_config import hf_config_from_model, model_config_from_hf
from hybrid_jax.convert.hf_weights import hf_tensors, load_hf_model, save_safetensors
from hybrid_jax.convert.run_dir import pretrained_experiment, refuse_a_run, write_run
from hybrid_jax.data.text import TOKENIZER_FILE
from hybrid_jax.data.tokenizer import (
    HF_GENERATION_CONFIG,
    HF_RUN_MODEL_CONFIG,
    HF_TOKENIZER_CONFIG,
    HFTokenizer,
    load_tokenizer,
)
from hybrid_jax.nn.lm import LanguageModel

HF_CONFIG = HF_RUN_MODEL_CONFIG  # the imported config.json, inside a run directory
GENERATION_CONFIG = HF_GENERATION_CONFIG
TOKENIZER_FILES = (TOKENIZER_FILE, HF_TOKENIZER_CONFIG, GENERATION_CONFIG)


def read_hf_config(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: expected a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def import_hf(directory: str | Path, run_dir: str | Path, *, dtype: str = "float32",
              mesh: Mesh | None = None, scan_layers: bool = False
              ) -> tuple[ExperimentConfig, LanguageModel]:
    """Reads the Hugging Face model in `directory` (parameters in `dtype`, sharded over `mesh`)
    and writes it as the run directory `run_dir` (`scan_layers`: its layers stacked for
    `nnx.scan`, fast compiles; `generate` and `export` unstack them)."""
    directory, run_dir = Path(directory), Path(run_dir)
    refuse_a_run(run_dir)  # before the model loads (`write_run` checks again)
    hf = read_hf_config(directory / "config.json")
    config = model_config_from_hf(hf, dtype=dtype)
    if not (directory / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"{directory / TOKENIZER_FILE} not found: the import needs the "
                                "model's tokenizer")
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens, more than "
                         f"the model's vocab_size={config.vocab_size}")
    model = load_hf_model(directory, config, mesh=mesh).with_scan_layers(scan_layers)
    experiment = pretrained_experiment(
        f"hf-{hf['model_type']}", model.config, run_dir,
        description=f"{hf['model_type']} imported from {directory.absolute()}")
    files = tuple(directory / f for f in TOKENIZER_FILES if (directory / f).is_file())
    with tempfile.TemporaryDirectory() as scratch:
        # Among write_run's files (written with the run, removed with it on a failure): written
        # after the run, a failure in between left a run that export took for one trained here.
        (Path(scratch) / HF_CONFIG).write_text(json.dumps(hf, indent=2))
        write_run(run_dir, experiment, model, files=(*files, Path(scratch) / HF_CONFIG),
                  source=str(directory.absolute()))
    return experiment, model


def export_config(config: ModelConfig, run_dir: Path, out: Path) -> dict:
    """The Hugging Face config.json of the model (of `config`) of run `run_dir`, exported to
    `out`; refuses an `out` that is not new or empty, and a model a Llama-family config cannot
    describe (`export` checks before it loads the checkpoint)."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        found = sorted(p.name for p in out.iterdir())[:4] if out.is_dir() else "a file"
        raise ValueError(f"export: {out} is not an empty directory (it holds {found}): choose a "
                         "new --out")
    base = (read_hf_config(run_dir / HF_CONFIG) if (run_dir / HF_CONFIG).is_file() else None)
    return hf_config_from_model(config, base)


def export_hf(model: LanguageModel, run_dir: str | Path, out: str | Path, *,
              max_shard_bytes: int = 5 * 2**30) -> Path:
    """Writes `model` (of the run in `run_dir`) as a Hugging Face directory `out`: config.json,
    safetensors in the parameters' dtype, and the run's tokenizer files.

    A model trained here (no imported config.json) gets its token ids from the run's tokenizer:
    `eos_token_id` its EOS, no BOS, and a `tokenizer_config.json` naming the EOS for
    transformers' `PreTrainedTokenizerFast` (byte and word tokenizers are ours only: their
    tokenizer.json is copied for a re-import, transformers cannot read it). A model with
    scanned (stacked) layers is written per layer. `out` must be new or an empty directory:
    files of another model there (its shards, its index) would mix with these."""
    run_dir, out = Path(run_dir), Path(out)
    model = model.with_scan_layers(False)
    hf = export_config(model.config, run_dir, out)
    base = (run_dir / HF_CONFIG).is_file()
    tokenizer = (load_tokenizer(run_dir / TOKENIZER_FILE)
                 if (run_dir / TOKENIZER_FILE).is_file() else None)
    if not base and tokenizer is not None:
        hf.update(eos_token_id=tokenizer.eos_id, bos_token_id=None)
    tensors, created = hf_tensors(model), not out.exists()
    try:
        save_safetensors(tensors, out, max_shard_bytes=max_shard_bytes)
        (out / "config.json").write_text(json.dumps(hf, indent=2))
        for name in TOKENIZER_FILES:
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, out / name)
        if not base and isinstance(tokenizer, HFTokenizer):
            # Over what the run recorded (`HFTokenizer.save` may have written only the
            # `eos_token` its tokenizer.json leaves unsaid): what transformers needs to load it.
            copied = out / HF_TOKENIZER_CONFIG
            recorded = json.loads(copied.read_text()) if copied.is_file() else {}
            copied.write_text(json.dumps(
                {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                 "clean_up_tokenization_spaces": False, **recorded,
                 "eos_token": tokenizer.tokenizer.id_to_token(tokenizer.eos_id)}, indent=2))
    except BaseException:
        # A half-written export (some shards, no config.json) would pass for a damaged model
        # and make a retry refuse `out` as not empty: remove what was written (all of `out`'s
        # files: it was new or empty).
        for path in out.iterdir() if out.is_dir() else ():
            path.unlink()
        if created and out.is_dir():
            out.rmdir()
        raise
    return out

