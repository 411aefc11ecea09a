"""`radixserve ingest`: files and folders into a collection, straight on disk."""

import pytest

from retrieval.collections import Collections
from server import cli
from server.retrieval_service import load_default_embedder


@pytest.mark.model
def test_ingest_files_and_folders(tmp_path, capsys):
    notes = tmp_path / "notes"
    (notes / "deep").mkdir(parents=True)
    (notes / "volcano.md").write_text("# Volcanoes\n\nMagma rises and erupts as lava.")
    (notes / "deep" / "bread.txt").write_text("Sourdough bread rises with wild yeast.")
    (notes / "deep" / "empty.txt").write_text("  \n")
    (notes / "script.py").write_text("print('not a note')")
    single = tmp_path / "orbit.txt"
    single.write_text("Satellites fall around the Earth as fast as it curves away.")
    home = tmp_path / "collections"

    argv = ["ingest", "notes", str(notes), str(single), "--collections-dir", str(home), "--quiet"]
    assert cli.main(argv) == 0
    assert "3 files ingested (1 empty); 3 documents" in capsys.readouterr().out
    assert cli.main(argv) == 0  # again: the same ids, replaced
    assert "3 documents" in capsys.readouterr().out

    collections = Collections(home, load_default_embedder)
    hit = collections.search("notes", "what makes bread dough rise", 1)[0]
    assert hit.id == "notes/deep/bread.txt" and hit.metadata == {"path": str(notes / "deep" / "bread.txt")}
    assert {"notes/volcano.md", "orbit.txt"} <= {h.id for h in collections.search("notes", "lava", 3)}
    assert (home / "notes" / "index.faiss").is_file()  # built and saved by the command


def test_ingest_errors(tmp_path, capsys):
    assert cli.main(["ingest", "notes", str(tmp_path / "missing"), "--collections-dir", str(tmp_path)]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "a.txt").write_text("text")
    assert cli.main(["ingest", "../bad", str(tmp_path / "a.txt"), "--collections-dir", str(tmp_path / "c")]) == 1
    assert "is not valid" in capsys.readouterr().err
