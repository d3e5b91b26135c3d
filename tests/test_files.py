"""Whole files only: a write that fails leaves the previous file and no temporary file."""

import os
import stat
import threading

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


def test_writers_of_one_file_at_once_each_write_a_whole_file(tmp_path):
    """Two threads replacing one file over and over: each write goes through a temporary file
    of its own (a shared `NAME.tmp` was renamed away half-written or from under the other
    writer), so the file is always one writer's whole text and nothing is left beside it."""
    path = tmp_path / "rows.csv"
    texts = ["a" * 20_000 + "\n", "b" * 30_000 + "\n"]
    errors = []

    def write(text):
        try:
            for _ in range(200):
                write_atomic(path, text)
                assert path.read_text() in texts
        except BaseException as error:  # noqa: BLE001  (reported by the test's thread)
            errors.append(error)

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]


def test_a_replaced_file_gets_the_mode_a_plain_write_gives(tmp_path):
    """The umask's mode (0644 under umask 022), as `open` creates a file: not the 0600 of a
    `tempfile.mkstemp` file, which would hide a run's files from the others of its group."""
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        assert stat.S_IMODE(write_atomic(tmp_path / "new.txt", "x").stat().st_mode) == 0o644
        assert stat.S_IMODE(plain.stat().st_mode) == 0o644
    finally:
        os.umask(old)
