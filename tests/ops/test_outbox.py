"""ops/outbox.py: what a lent machine sends home goes out in the order queued, each file once, each call
within the device tool's limits (files, MiB together) less the room kept for what the call writes after."""

from __future__ import annotations

import pytest

from ops.outbox import main, queue, send


def test_each_call_sends_what_it_has_room_for_in_order_each_file_once(tmp_path):
    files = []
    for name, size in (("a", 600), ("b", 600), ("c", 300), ("d", 100)):
        files.append(tmp_path / name)
        files[-1].write_bytes(bytes(size))
    outbox, calls = tmp_path / "outbox", [tmp_path / f"out{i}" for i in range(4)]
    for out in calls:
        out.mkdir()
    queue(outbox, files, file_mib=1)
    limits = dict(files=3, total_mib=1400 / 2**20)
    # room for 1,400 bytes less 400 kept: a (600); b would pass 1,000, c (300) fits after it, d (100) too
    assert send(outbox, calls[0], **limits, keep_mib=400 / 2**20) == (["a", "c", "d"], ["b"])
    (calls[1] / "results.tar").write_bytes(bytes(900))  # written earlier in the call: counted
    assert send(outbox, calls[1], **limits) == ([], ["b"])
    assert send(outbox, calls[2], **limits) == (["b"], [])
    assert sorted(p.name for p in calls[2].iterdir()) == ["b"]
    assert send(outbox, calls[3], **limits, keep_files=2, again=True) == (["a"], ["b", "c", "d"])


def test_a_file_larger_than_a_call_brings_back_is_refused(tmp_path, capsys):
    big = tmp_path / "model.safetensors"
    big.write_bytes(bytes(2 * 2**20))
    with pytest.raises(ValueError, match="split it into parts first"):
        queue(tmp_path / "outbox", [big], file_mib=1)
    with pytest.raises(SystemExit, match="^error: .*more than a call brings back"):
        main(["queue", str(tmp_path / "outbox"), str(big), "--file-mib", "1"])
    main(["queue", str(tmp_path / "outbox"), str(big), "--file-mib", "16"])
    (tmp_path / "out").mkdir()
    main(["send", str(tmp_path / "outbox"), str(tmp_path / "out"), "--total-mib", "1"])
    assert "left for 'bash ops/gpu_lease.sh more'" in capsys.readouterr().out
