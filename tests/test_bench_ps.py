"""`make bench-ps`'s pieces (benchmarks/support/ps_bench.py): the bytes of each codec, and a short real run."""

from __future__ import annotations

import argparse

import pytest

from trainer_benchmarks.bench_ps import parse_codecs
from trainer_benchmarks.support.ps_bench import frame_bytes, measure_ps, model_layout


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


@pytest.mark.timeout(180)
def test_rows_put_the_authenticated_echo_between_raw_and_the_server():
    from trainer_benchmarks.bench_ps import COLUMNS, run

    rows = run([20_000], [1], 0.4, ["none"], shards=[1], macs=[True, False])
    assert [r["mac"] for r in rows] == ["on", "off"] and all(set(COLUMNS) <= set(r) for r in rows)
    on, off = rows
    assert on["echo_per_s"] > 10 and on["echo_vs_raw"] == pytest.approx(on["echo_per_s"] / on["raw_per_s"])
    assert on["vs_echo"] == pytest.approx(on["ps_per_s"] / on["echo_per_s"])
    assert off["echo_per_s"] is None and off["echo_vs_raw"] is None and off["vs_echo"] is None


@pytest.mark.timeout(60)
def test_the_authenticated_echo_drops_a_peer_without_its_key():
    import socket

    from trainer.transport.frame_auth import Channel
    from trainer.transport.wire import ConnectionClosed, IntegrityError, RecvBuffer, new_secret
    from trainer_benchmarks.support.ps_bench import _AuthenticatedEcho, _frames

    commit, reply = _frames(model_layout(20_000), "none")
    keys = (new_secret(), new_secret())
    server = _AuthenticatedEcho(reply, "poly1305", keys)
    try:
        for send_key, answered in ((keys[0], True), (new_secret(), False)):
            with socket.create_connection(server.address, timeout=30) as sock:
                channel = Channel(sock, mac="poly1305", send_key=send_key, recv_key=keys[1], peer="echo")
                channel.send(commit)
                if answered:
                    assert channel.recv(None, into=RecvBuffer()).nbytes > 20_000 * 4
                else:
                    with pytest.raises((ConnectionClosed, IntegrityError)):
                        channel.recv(None)
    finally:
        server.close()
