"""`make bench-ps`'s pieces (jobs/support/ps_bench.py): the bytes of each codec, and a short real run."""

from __future__ import annotations

import argparse

import pytest

from trainer_jobs.bench_ps import parse_codecs
from trainer_jobs.support.ps_bench import frame_bytes, measure_ps, model_layout


def test_replies_through_the_codec_halve_the_reply_as_bf16_halves_the_commit():
    shapes = model_layout(1_000_000)
    dense_in, dense_out = frame_bytes(shapes, "none")
    commit_only = frame_bytes(shapes, "bf16")
    both = frame_bytes(shapes, "bf16+replies")
    assert commit_only[1] == dense_out and commit_only[0] == both[0]
    assert both[1] / dense_out == pytest.approx(0.5, abs=0.001) and both[0] / dense_in == pytest.approx(0.5, abs=0.001)
    assert frame_bytes(shapes, "topk:0.01+replies")[1] < 0.03 * dense_out


def test_codec_names_are_checked_with_or_without_replies():
    assert parse_codecs("none, bf16+replies") == ["none", "bf16+replies"]
    with pytest.raises(argparse.ArgumentTypeError, match="Unknown compression"):
        parse_codecs("zstd+replies")


@pytest.mark.timeout(120)
def test_a_client_process_commits_against_a_server_with_compressed_replies():
    assert measure_ps(model_layout(20_000), 1, 0.5, "bf16+replies") > 10
