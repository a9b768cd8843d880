"""Partitions of the inputs (one per machine of a sharded run): every line read exactly once, in
order, with its true line number, whatever the number of partitions and wherever the cuts fall."""

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


def test_json_nested_past_the_parser_is_malformed_json_with_file_and_line():
    import pytest

    from megatron_endprompt.data.tokenize.read_input import parse_line
    from megatron_endprompt.errors import UserError

    deep = "[" * 200_000 + "]" * 200_000
    for line in (f'{{"text": {deep}}}', f'{{"meta": {deep}, "text": "x"}}'):
        with pytest.raises(UserError, match=r"^in\.jsonl:7: malformed JSON \(arrays or objects "
                                            "nested deeper"):
            parse_line("in.jsonl", 7, line.encode(), ["text"])
