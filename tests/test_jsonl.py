"""Durable JSON lines on a real full disk: a line the disk cannot hold is taken back whole."""

from __future__ import annotations

import errno

import pytest

from eyas.jsonl import DurableAppender
from tests.disks import fill, small_disk


def test_a_line_the_disk_cannot_hold_is_taken_back_and_the_error_names_the_file(tmp_path):
    with small_disk(tmp_path / "disk", "1M") as disk:
        path = disk / "records.jsonl"
        with DurableAppender(path) as out:
            out.write('{"n": 1}')
            fill(disk)
            # Longer than the free end of the file's last page, so part of it is written first.
            with pytest.raises(OSError) as raised:
                out.write('{"n": 2, "pad": "' + "x" * 8192 + '"}')
            assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
        assert path.read_text() == '{"n": 1}\n'
