"""Whole files only: a write that fails leaves the previous file and no temporary file."""

import pytest

from hybrid_jax.files import replacing, write_atomic


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_tmp(tmp_path):
    path = write_atomic(tmp_path / "new" / "rows.csv", "a,b\r\n1,2\r\n")  # folders created
    assert path.read_bytes() == b"a,b\r\n1,2\r\n"  # UTF-8, line endings as given
    with pytest.raises(OSError, match="No space left"), replacing(path) as tmp:
        tmp.write_text("a,b\r\n1,")
        raise OSError("No space left on device")
    assert path.read_bytes() == b"a,b\r\n1,2\r\n"
    assert [p.name for p in path.parent.iterdir()] == ["rows.csv"]
    write_atomic(path, "é\n")
    assert path.read_text(encoding="utf-8") == "é\n"
