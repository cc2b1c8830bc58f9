"""`ftjob operator` flags: a bad worker count is a usage message naming the flag, not a traceback."""

from __future__ import annotations

import argparse

import pytest

from finetune_operator.cli import operator_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftjob operator")
    operator_cmd.configure(parser)
    return parser


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_workers_must_be_a_positive_whole_number(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--workers", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "at least 1" in err


def test_workers_default_and_value() -> None:
    assert build_parser().parse_args([]).workers == 16
    assert build_parser().parse_args(["--workers", "4"]).workers == 4


def test_kueue_flags() -> None:
    args = build_parser().parse_args(["--kueue", "--default-queue-name", "team"])
    assert args.kueue and args.default_queue_name == "team"
    plain = build_parser().parse_args([])
    assert not plain.kueue and plain.default_queue_name is None


def test_a_default_queue_without_kueue_is_refused_before_anything_starts() -> None:
    args = build_parser().parse_args(["--default-queue-name", "team"])
    with pytest.raises(SystemExit, match="needs --kueue"):
        operator_cmd.run(args)


def test_master_port_default_and_value() -> None:
    assert build_parser().parse_args([]).master_port == 29500
    assert build_parser().parse_args(["--master-port", "31234"]).master_port == 31234
