"""The MongoDB backup driver, run inside the backup Job with pymongo (no MongoDB tools needed):
every collection of every database but MongoDB's own (admin, local, config), as the BSON of its
documents, read as they are stored and never decoded, one object per collection, with its
options and indexes beside it (`<database>/<collection>.meta.json`; a view has only that).
Restored into a new instance, collection by collection, views last; a collection that already
holds documents is refused, never written over. Users are not part of the backup: the
restored instance has its own, and `MongoDBUser` resources make the others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from bson import json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from backup.driver import CheckFailed, Driver, Sink, Source, Taken, WalArchive
from backup.manifest import Manifest
from services.mongodb.servers import write_ca_file

SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
CHUNK = 4 * 1024 * 1024  # bytes of BSON per part sent to the storage
BATCH = 1000  # documents per insert when restoring
RAW = CodecOptions(document_class=RawBSONDocument)


class DumpRefused(Exception):
    pass


def connect() -> MongoClient:
    """The instance's client Service over TLS, its name verified with the instance CA
    (MONGODB_CA: pymongo reads a CA from a file only, written to the Job's /tmp)."""
    return MongoClient(
        host=os.environ["MONGODB_HOST"],
        port=int(os.environ["MONGODB_PORT"]),
        username=os.environ["MONGODB_USERNAME"],
        password=os.environ["MONGODB_PASSWORD"],
        authSource="admin",
        directConnection=True,
        appname="statefleet-backup",
        tls=True,
        tlsCAFile=write_ca_file(os.environ["MONGODB_CA"]),
    )


def object_name(database: str, collection: str, what: str) -> str:
    """`<database>/<collection>.<what>` (a database's name holds no `/`)."""
    return f"{database}/{collection}.{what}"


def counted(documents: Iterable[RawBSONDocument], tally: list[int]) -> Iterator[RawBSONDocument]:
    """The documents, counted in `tally[0]` as they pass."""
    for document in documents:
        tally[0] += 1
        yield document


def chunked(documents: Iterable[RawBSONDocument]) -> Iterator[bytes]:
    """The documents' BSON, back to back, in parts of about CHUNK bytes."""
    part = bytearray()
    for document in documents:
        part += document.raw
        if len(part) >= CHUNK:
            yield bytes(part)
            part.clear()
    if part:
        yield bytes(part)


def documents_of(chunks: Iterable[bytes]) -> Iterator[RawBSONDocument]:
    """The documents of a BSON stream, whatever the boundaries of its parts (each document
    starts with its own length, little-endian)."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= 4:
            size = int.from_bytes(pending[:4], "little")
            if size < 5:
                raise CheckFailed(f"a BSON document claims {size} bytes: the object is damaged")
            if len(pending) < size:
                break
            yield RawBSONDocument(bytes(pending[:size]), RAW)
            del pending[:size]
    if pending:
        raise CheckFailed(f"the BSON stream ends inside a document ({len(pending)} bytes left)")


def collection_meta(spec: dict[str, Any], indexes: list[dict[str, Any]]) -> dict[str, Any]:
    """What recreates a collection (`listCollections`' entry, as extended JSON): its type,
    its options (capped, validator, collation, a view's pipeline ...) and its indexes."""
    return {
        "type": spec.get("type", "collection"),
        "options": spec.get("options") or {},
        "indexes": index_specs(indexes),
    }


def index_specs(indexes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `createIndexes` takes back (everything `listIndexes` says but its version), less
    the `_id` index every collection has."""
    return [
        {k: v for k, v in index.items() if k not in ("v", "ns")}
        for index in indexes
        if index["name"] != "_id_"
    ]


class MongoDBDriver(Driver):
    """No capability beyond the core: a dump is restored into a new instance, once it runs."""

    methods = ("dump",)

    def backup(self, method: str, sink: Sink, archive: WalArchive | None = None) -> Taken:
        if method != "dump":
            raise DumpRefused(f"spec.method: MongoDB backs up its databases (dump), not {method}")
        with connect() as mongo:
            info = mongo.admin.command("buildInfo")
            version = info.get("version", "")
            if info.get("ferretdbVersion"):
                version += f" (FerretDB {info['ferretdbVersion']})"
            collections: dict[str, dict[str, int]] = {}
            views: dict[str, list[str]] = {}
            for database in sorted(set(mongo.list_database_names()) - SYSTEM_DATABASES):
                db = mongo.get_database(database, codec_options=RAW)
                for spec in db.list_collections():
                    spec = json.loads(json_util.dumps(spec))  # extended JSON: any option round-trips
                    collection = spec["name"]
                    if collection.startswith("system."):
                        continue
                    if spec.get("type") == "view":
                        meta = collection_meta(spec, [])
                        views.setdefault(database, []).append(collection)
                    else:
                        tally = [0]
                        cursor = db[collection].find({}, sort=[("_id", 1)], batch_size=BATCH)
                        sink.write_object(
                            object_name(database, collection, "bson"), chunked(counted(cursor, tally))
                        )
                        collections.setdefault(database, {})[collection] = tally[0]
                        indexes = [json.loads(json_util.dumps(i)) for i in db[collection].list_indexes()]
                        meta = collection_meta(spec, indexes)
                    sink.write_object(
                        object_name(database, collection, "meta.json"), iter([json.dumps(meta).encode()])
                    )
        return Taken(version, details={"databases": collections, "views": views})

    def restore(self, manifest: Manifest, source: Source) -> dict[str, Any]:
        expected: dict[str, dict[str, int]] = manifest.details.get("databases") or {}
        restored: dict[str, dict[str, int]] = {}
        with connect() as mongo:
            occupied = [
                f"{database}.{collection}"
                for database, collections in expected.items()
                for collection in collections
                if mongo[database][collection].estimated_document_count() > 0
            ]
            if occupied:
                raise DumpRefused(
                    "the instance already holds documents in "
                    + ", ".join(sorted(occupied)[:10])
                    + ": a dump is restored into empty collections only"
                )
            for database, collections in sorted(expected.items()):
                db = mongo.get_database(database, codec_options=RAW)
                for collection in sorted(collections):
                    meta = json_util.loads(b"".join(source(object_name(database, collection, "meta.json"))))
                    db.create_collection(collection, check_exists=False, **meta["options"])
                    if meta["indexes"]:
                        db.command({"createIndexes": collection, "indexes": meta["indexes"]})
                    count = 0
                    batch: list[RawBSONDocument] = []
                    for document in documents_of(source(object_name(database, collection, "bson"))):
                        batch.append(document)
                        if len(batch) == BATCH:
                            db[collection].insert_many(batch, ordered=True)
                            count += len(batch)
                            batch = []
                    if batch:
                        db[collection].insert_many(batch, ordered=True)
                        count += len(batch)
                    restored.setdefault(database, {})[collection] = count
            for database, names in sorted((manifest.details.get("views") or {}).items()):
                for view in names:  # after their collections: a view reads them
                    meta = json_util.loads(b"".join(source(object_name(database, view, "meta.json"))))
                    mongo[database].create_collection(view, **meta["options"])
        return {"databases": restored, "views": manifest.details.get("views") or {}}

    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        """Every collection holds at least the backup's documents; with `query` (a database
        command as JSON, run on `database`), its reply's `n` (or `ok` when it has none) is non-zero."""
        expected: dict[str, dict[str, int]] = manifest.details.get("databases") or {}
        found: dict[str, dict[str, int]] = {}
        with connect() as mongo:
            for name, collections in expected.items():
                for collection in collections:
                    found.setdefault(name, {})[collection] = mongo[name][collection].count_documents({})
            short = [
                f"{name}.{collection}: {found[name][collection]} of {n}"
                for name, collections in expected.items()
                for collection, n in collections.items()
                if found[name][collection] < n
            ]
            if short:
                raise CheckFailed(
                    "the instance holds fewer documents than the backup: " + ", ".join(short[:10])
                )
            answer: Any = None
            if query:
                if not database:
                    raise CheckFailed(
                        "spec.check.database: a MongoDB check query runs in a database: name it"
                    )
                try:
                    command = json_util.loads(query)
                except ValueError as error:
                    raise CheckFailed(f"spec.check.query: not a JSON database command: {error}") from error
                reply = mongo[database].command(command)
                answer = reply.get("n", reply.get("ok"))
                if not answer:
                    raise CheckFailed(f"spec.check.query answered {answer!r}: {json_util.dumps(reply)[:300]}")
        return {"databases": found, **({"query": answer} if query else {})}


DRIVER = MongoDBDriver()
