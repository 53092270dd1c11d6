"""The MongoDB dump's pure parts: documents to BSON parts and back, whatever the parts'
boundaries, and the index specs `createIndexes` takes back."""

import datetime

import bson
import pytest
from bson.raw_bson import RawBSONDocument

from backup.driver import CheckFailed
from services.mongodb.backup_driver import (
    chunked,
    collection_meta,
    counted,
    documents_of,
    index_specs,
    object_name,
)

pytestmark = pytest.mark.unit


def raw(document: dict) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(document))


def test_documents_survive_any_split_of_the_stream() -> None:
    documents = [
        {
            "_id": bson.ObjectId(),
            "n": i,
            "at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
            "b": b"\x00" * i,
        }
        for i in range(50)
    ]
    stream = b"".join(chunked(raw(d) for d in documents))
    for size in (1, 3, 7, 64, len(stream)):
        parts = [stream[i : i + size] for i in range(0, len(stream), size)]
        decoded = [bson.decode(d.raw) for d in documents_of(parts)]
        assert [d["n"] for d in decoded] == list(range(50))
        assert decoded[7]["_id"] == documents[7]["_id"]


def test_a_truncated_stream_is_refused() -> None:
    stream = b"".join(chunked([raw({"a": 1}), raw({"b": 2})]))
    with pytest.raises(CheckFailed, match="ends inside a document"):
        list(documents_of([stream[:-3]]))


def test_documents_are_counted_as_they_pass() -> None:
    tally = [0]
    assert len(b"".join(chunked(counted([raw({"i": i}) for i in range(12)], tally)))) > 0
    assert tally == [12]


def test_index_specs_leave_out_the_id_index_and_the_version() -> None:
    listed = [
        {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        {"v": 2, "key": {"sku": 1}, "name": "sku_1", "unique": True},
    ]
    assert index_specs(listed) == [{"key": {"sku": 1}, "name": "sku_1", "unique": True}]
    assert object_name("shop", "orders.2026", "bson") == "shop/orders.2026.bson"


def test_a_collections_options_and_a_views_pipeline_are_kept() -> None:
    capped = {"name": "log", "type": "collection", "options": {"capped": True, "size": 4096}, "info": {}}
    assert collection_meta(capped, [{"v": 2, "key": {"_id": 1}, "name": "_id_"}]) == {
        "type": "collection",
        "options": {"capped": True, "size": 4096},
        "indexes": [],
    }
    view = {
        "name": "big",
        "type": "view",
        "options": {"viewOn": "items", "pipeline": [{"$match": {"n": {"$gt": 5}}}]},
    }
    assert collection_meta(view, [])["options"]["viewOn"] == "items"
