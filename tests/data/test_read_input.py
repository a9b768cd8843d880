"""Partitions of the inputs (issue 10 item 4): every line read exactly once, in order, with its
true line number, whatever the number of partitions and wherever the cuts fall."""

from __future__ import annotations

from megatron_endprompt.data.tokenize.read_input import input_range, read_lines


def test_partitions_cover_every_line_once_with_true_numbers(tmp_path):
    files = []
    for k, lines in enumerate([[b"a\n", b"\n", b"bb\n", b"ccc\n"], [b"d\n"], [b"ee\n", b"f"],
                               [b"\n", b"ggg\n"]]):
        path = tmp_path / f"in{k}.jsonl"
        path.write_bytes(b"".join(lines))
        files.append((str(path), lines))
    expected = [(p, i + 1, raw) for p, lines in files for i, raw in enumerate(lines)]
    paths = [p for p, _ in files]
    total = sum(len(b"".join(lines)) for _, lines in files)
    for n in range(1, total + 2):
        got = [item for i in range(n) for item in read_lines(input_range(paths, i, n))]
        assert got == expected, n
