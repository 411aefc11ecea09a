"""Retrieval: sentence embeddings (all-MiniLM-L6-v2 in torch) and named collections of documents
(SQLite as the truth, FAISS derived from it). Start at `retrieval.collections`. Imports nothing
of the project."""
