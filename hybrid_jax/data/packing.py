"""Fixed-length training examples cut from a token stream, with document boundaries kept.

Window `i` covers stream positions `[i·L, i·L + L]`: inputs are the first `L` tokens, targets
the last `L`, so consecutive windows score every token of the stream once (after the first).
Several documents share a window; `segment_ids` (1, 2, ... per document in the window, 0 for
padding) keep attention and recurrences from mixing them, and `positions` restart at 0 where a
document starts (and at the window start).
"""

from __future__ import annotations

import numpy as np

from hybrid_jax.data.corpus import TokenStream


class PackedWindows:
    """A grain random-access source of `{inputs, targets, mask, segment_ids, positions}` rows.

    `pad_last`: also emit the final partial window, padded (mask 0), so evaluation covers the
    whole stream. `token_bytes[vocab]`: adds `target_bytes`, the UTF-8 bytes of each scored
    target (for bits-per-byte). `where` names the stream's source in errors.
    """

    def __init__(self, stream: TokenStream, seq_len: int, *, pad_last: bool = False,
                 token_bytes: np.ndarray | None = None, where: str = "the data"):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.stream, self.seq_len, self.token_bytes = stream, seq_len, token_bytes
        targets = max(len(stream) - 1, 0)
        self._length = (-(-targets // seq_len)) if pad_last else targets // seq_len
        if self._length < 1:
            raise ValueError(f"{where} has {len(stream)} tokens, too few for one sequence of "
                             f"seq_len={seq_len} (+1 for the targets)")
        if len(stream.doc_starts) == 0 or stream.doc_starts[0] != 0:
            first = (f"its first at offset {int(stream.doc_starts[0])}" if len(stream.doc_starts)
                     else "no document starts")
            raise ValueError(f"a token stream must start a document at offset 0, got {first}")

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._length:
            raise IndexError(f"window {index} out of range for {self._length} windows")
        L, start = self.seq_len, int(index) * self.seq_len
        chunk = np.asarray(self.stream.tokens[start:start + L + 1], np.int32)
        n = len(chunk) - 1  # scored positions in this window (L except a padded last one)
        where = start + np.arange(n)
        doc = np.searchsorted(self.stream.doc_starts, where, side="right") - 1
        doc_start = np.maximum(self.stream.doc_starts[doc], start)
        row = {
            "inputs": chunk[:-1],
            "targets": chunk[1:],
            "mask": np.ones(n, bool),
            "segment_ids": (doc - doc[0] + 1).astype(np.int32),
            "positions": (where - doc_start).astype(np.int32),
        }
        if self.token_bytes is not None:
            row["target_bytes"] = self.token_bytes[row["targets"]].astype(np.int32)
        if n < L:
            row = {k: np.concatenate([v, np.zeros(L - n, v.dtype)]) for k, v in row.items()}
        return row
