"""A file in parts (imagetx/io/parts.py): joined again byte for byte, and refused when a part is
cut short, changed or missing."""

from __future__ import annotations

import json
import os

import pytest

from imagetx.io.parts import main, read_parts, write_parts


@pytest.mark.parametrize("size, part_bytes, count", [(10_000, 4096, 3), (4096, 4096, 1), (0, 10, 1), (5, None, 1)])
def test_parts_join_to_the_bytes_they_were_cut_from(tmp_path, size, part_bytes, count):
    data = os.urandom(size)
    record = write_parts(data, tmp_path, "model.safetensors", part_bytes)
    assert record["parts"] == [f"model.safetensors.part{i:02d}" for i in range(count)]
    assert all((tmp_path / name).stat().st_size <= (part_bytes or size) for name in record["parts"])
    assert read_parts(tmp_path, record) == data


def test_a_cut_changed_or_missing_part_is_refused(tmp_path):
    record = write_parts(os.urandom(9000), tmp_path, "file", 4096)
    middle = tmp_path / record["parts"][1]
    whole = middle.read_bytes()
    middle.write_bytes(whole[:-1])
    with pytest.raises(ValueError, match="do not add up"):
        read_parts(tmp_path, record)
    middle.write_bytes(bytes([whole[0] ^ 1]) + whole[1:])  # same size, one bit changed
    with pytest.raises(ValueError, match="do not add up"):
        read_parts(tmp_path, record)
    middle.unlink()
    with pytest.raises(OSError):
        read_parts(tmp_path, record)
    with pytest.raises(ValueError, match="part_bytes=0"):
        write_parts(b"x", tmp_path, "file", 0)


def test_split_and_join_on_the_command_line(tmp_path, capsys):
    source = tmp_path / "model.safetensors"
    source.write_bytes(os.urandom(3 * 2**20 + 7))
    main(["split", str(source), str(tmp_path / "parts"), "--part-mib", "1"])
    manifest = tmp_path / "parts" / "model.safetensors.parts.json"
    assert capsys.readouterr().out.strip() == str(manifest)
    assert len(json.loads(manifest.read_text())["parts"]) == 4
    main(["join", str(manifest), str(tmp_path / "joined")])
    assert (tmp_path / "joined").read_bytes() == source.read_bytes()
    (tmp_path / "parts" / "model.safetensors.part03").unlink()
    with pytest.raises(SystemExit, match="^error: .*model.safetensors.part03"):
        main(["join", str(manifest), str(tmp_path / "again")])
    assert not (tmp_path / "again").exists()  # nothing written from parts that do not add up


@pytest.mark.parametrize("value, why", [("0", "at least one byte"), ("-1", "at least one byte"),
                                        ("big", "not a number of MiB")])
def test_every_command_that_writes_parts_refuses_a_part_size_in_one_line(tmp_path, capsys, value, why):
    from imagetx.training.continuation import main as pack_main
    from imagetx.training.grow import main as grow_main

    source = tmp_path / "file"
    source.write_bytes(b"x")
    for command in (lambda: main(["split", str(source), str(tmp_path / "parts"), "--part-mib", value]),
                    lambda: pack_main(["pack", str(source), str(tmp_path / "packed"), "--part-mib", value]),
                    lambda: grow_main([str(source), str(tmp_path / "grown"), "--part-mib", value])):
        with pytest.raises(SystemExit) as stop:
            command()
        assert stop.value.code == 2  # argparse's usage error, before anything is read or written
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.endswith(why) and "argument --part-mib" in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]
