"""Offsets in Spark's log: round trip, tolerance of unknown fields, refusal of foreign JSON."""

from __future__ import annotations

from flinkish_spark.source.offset import SourceOffset


def test_round_trip_keeps_every_field_and_omits_empty_ones() -> None:
    off = SourceOffset("orders", 7, "FINISHED", "s3://b/meta", "http://127.0.0.1:9000", "eu-west-1", "r1", "pending")
    d = off.to_json()
    assert SourceOffset.from_json(d) == off
    assert set(SourceOffset("orders", -1).to_json()) == {"v", "uid", "ckpt"}


def test_unknown_fields_are_ignored_and_foreign_offsets_are_not_flinkish() -> None:
    assert SourceOffset.from_json('{"v": 1, "uid": "a", "ckpt": 3, "future": true}') == SourceOffset("a", 3)
    assert SourceOffset.from_json('{"logOffset": 3}') is None
    assert SourceOffset.from_json("12") is None
    assert SourceOffset.from_json("not json") is None


def test_credentials_are_never_part_of_the_storage_options() -> None:
    off = SourceOffset("a", 1, root="s3://b/m", endpoint_url="http://e", region="r")
    assert off.storage_options() == {"endpointUrl": "http://e", "region": "r"}
