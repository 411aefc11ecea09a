"""`radixserve ingest COLLECTION PATH...`: add .txt/.md files to a collection, straight on disk.

No server needed (a running one sees the documents: the store is shared through SQLite).
The collection is created when missing. Each file is one document; its id is its path
from the folder named on the command line, that folder's name included (`notes/a/b.md`),
or its name when the file itself was named (`b.md`): ingesting it again replaces it. Its
metadata is {"path": <absolute path>}.
Files go in batches, each one transaction: killed midway, the collection keeps every
batch committed before, and nothing of the batch in flight.

With `--server URL` the batches go through that running server's collections API instead
(server/ingest_remote.py), and the server computes each chunk's document KV as it adds it
(unless `--no-precompute`, or the server has document reuse off). On disk, no model is loaded
and no KV is computed.
"""

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from store.errors import RadixserveError
from retrieval.collections import Collections, NewDocument
from retrieval.errors import CollectionExistsError, RetrievalError
from server.retrieval_service import load_default_embedder
from server.settings import default_collections_dir

SUFFIXES = (".txt", ".md")
BATCH_FILES = 16
BATCH_CHARS = 512 * 1024  # a batch closes once it holds this much text


def ingest(args: argparse.Namespace) -> int:
    files = list(_files(args.paths))
    if not files:
        raise RadixserveError(f"no {' or '.join(SUFFIXES)} files in {' '.join(args.paths)}")
    if args.server:
        return _ingest_through_server(args, files)
    root = Path(args.collections_dir).expanduser() if args.collections_dir else default_collections_dir()
    collections = Collections(root, load_default_embedder)
    try:
        num_documents, num_chunks_before = _open(collections, args.collection)
        num_ingested = 0
        with tqdm(total=len(files), unit="file", disable=args.quiet, file=sys.stderr,
                  desc=f"ingest {args.collection}") as bar:
            for batch in _batches(files):
                documents = [NewDocument(text, document_id, {"path": str(path)}) for document_id, path, text in batch]
                collections.add_documents(args.collection, documents)
                num_ingested += len(batch)
                bar.update(len(batch))
            bar.update(bar.total - bar.n)  # the empty files, left out
        collections.sync_index(args.collection)
        info = collections.info(args.collection)
    except RetrievalError as error:
        raise RadixserveError(str(error)) from None
    finally:
        collections.close()
    print(f"{args.collection}: {num_ingested} files ingested ({len(files) - num_ingested} empty); "
          f"{info.num_documents} documents, "
          f"{info.num_chunks} chunks (was {num_documents}, {num_chunks_before})")
    return 0


def _ingest_through_server(args: argparse.Namespace, files: list[tuple[str, Path]]) -> int:
    from server.ingest_remote import ingest_through_server
    from server.settings import api_key_from_environment

    api_key = args.api_key or api_key_from_environment()
    num_ingested, num_precomputed, info = ingest_through_server(
        args.server, api_key, args.collection, _batches(files), len(files), not args.no_precompute, args.quiet)
    print(f"{args.collection}: {num_ingested} files ingested ({len(files) - num_ingested} empty) through "
          f"{args.server}; {info['num_documents']} documents, {info['num_chunks']} chunks; "
          f"{num_precomputed} tokens of document KV computed")
    return 0


def _open(collections: Collections, name: str) -> tuple[int, int]:
    try:
        collections.create(name)
    except CollectionExistsError:
        pass
    info = collections.info(name)
    return info.num_documents, info.num_chunks


def _files(paths: list[str]) -> Iterator[tuple[str, Path]]:
    """(document id, absolute path) of each .txt / .md file named or found under a named folder, once."""
    seen = set()
    for given in paths:
        path = Path(given).expanduser().resolve()
        if not path.exists():
            raise RadixserveError(f"{given}: no such file or directory")
        found = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in found:
            document_id = file.relative_to(path.parent).as_posix()
            if file.suffix.lower() in SUFFIXES and file.resolve() not in seen:
                seen.add(file.resolve())
                yield document_id, file.resolve()


def _batches(files: list[tuple[str, Path]]) -> Iterator[list[tuple[str, Path, str]]]:
    """(document id, path, text) batches; empty files are left out."""
    batch, num_chars = [], 0
    for document_id, path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        batch.append((document_id, path, text))
        num_chars += len(text)
        if len(batch) >= BATCH_FILES or num_chars >= BATCH_CHARS:
            yield batch
            batch, num_chars = [], 0
    if batch:
        yield batch
