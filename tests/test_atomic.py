"""envace.core.atomic: a file is replaced whole or left as it was."""

import json

import pytest

from envace.core import atomic


def test_write_json_makes_the_folder_and_reads_back_without_leaving_a_tmp_file(tmp_path):
    path = tmp_path / "a" / "b" / "results.json"
    atomic.write_json(str(path), {"x": [1, 2]})
    assert json.loads(path.read_text()) == {"x": [1, 2]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


def test_a_write_that_fails_midway_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    atomic.write_json(str(path), {"step": 1})

    def killed(*a):  # the process dies between writing the new text and renaming it over the old file
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_json(str(path), {"step": 2})
    assert json.loads(path.read_text()) == {"step": 1}


def test_write_lines_ends_every_line_with_one_newline(tmp_path):
    path = tmp_path / "m.jsonl"
    atomic.write_lines(str(path), ['{"a": 1}\n', '{"a": 2}'])
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'
