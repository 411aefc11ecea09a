"""`radixserve ingest --server URL`: files into a running server's collection, through its API.

The same files, ids, metadata and batches as the on-disk ingest (server/ingest_command.py), sent as
`POST /v1/collections/{name}/documents`, so the server, which has the model loaded, computes each
chunk's document KV as it adds it (server/document_precompute.py; `--no-precompute` sends
"precompute": false). The on-disk ingest loads no model, and the document KV store lives in a
server's memory: only through a server is KV computed at ingest.
"""

import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from tqdm import tqdm

from store.errors import RadixserveError

REQUEST_TIMEOUT_SECONDS = 3600  # one batch: its chunks' prefill at a few hundred tokens a second


class CollectionsClient:
    """The collections routes of the server at `base_url` (e.g. http://127.0.0.1:8000)."""

    def __init__(self, base_url: str, api_key: str | None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.precompute_skipped: str | None = None  # the server's reason, when it computed no document KV

    def create(self, name: str) -> None:
        """Creates the collection; one that exists already is fine."""
        status, body = self._post("/v1/collections", {"name": name}, ok=(201, 409))
        if status == 409 and body.get("error", {}).get("code") != "collection_exists":
            raise RadixserveError(f"{self.base_url}: {body.get('error', {}).get('message', body)}")

    def add(self, name: str, documents: list[dict], precompute: bool) -> int:
        """Adds the documents; the tokens the server computed for their document KV."""
        _, body = self._post(f"/v1/collections/{_quoted(name)}/documents",
                             {"documents": documents, "precompute": precompute})
        self.precompute_skipped = body.get("precompute_skipped") or self.precompute_skipped
        return body.get("num_precomputed_tokens", 0)

    def info(self, name: str) -> dict:
        return self._request("GET", f"/v1/collections/{_quoted(name)}", None, ok=(200,))[1]

    def _post(self, path: str, payload: dict, ok=(200,)) -> tuple[int, dict]:
        return self._request("POST", path, json.dumps(payload).encode(), ok)

    def _request(self, method: str, path: str, data: bytes | None, ok) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = _json_or_empty(error.read())
            if error.code in ok:
                return error.code, body
            message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
            raise RadixserveError(f"{self.base_url}: {error.code} {message or error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise RadixserveError(f"{self.base_url}: cannot reach the server ({reason})") from None


def ingest_through_server(base_url: str, api_key: str | None, collection: str, batches, num_files: int,
                          precompute: bool, quiet: bool) -> tuple[int, int, dict]:
    """(files ingested, tokens precomputed, the collection's info afterwards); `batches` as
    ingest_command._batches yields them."""
    client = CollectionsClient(base_url, api_key)
    client.create(collection)
    num_ingested = num_precomputed = 0
    with tqdm(total=num_files, unit="file", disable=quiet, file=sys.stderr, desc=f"ingest {collection}") as bar:
        for batch in batches:
            documents = [{"id": document_id, "text": text, "metadata": {"path": str(path)}}
                         for document_id, path, text in batch]
            num_precomputed += client.add(collection, documents, precompute)
            num_ingested += len(batch)
            bar.update(len(batch))
            bar.set_postfix(precomputed_tokens=num_precomputed)
        bar.update(bar.total - bar.n)  # the empty files, left out
    if client.precompute_skipped:
        print(f"radixserve ingest: {base_url} computed no document KV: {client.precompute_skipped}", file=sys.stderr)
    return num_ingested, num_precomputed, client.info(collection)


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _json_or_empty(data: bytes) -> dict:
    try:
        body = json.loads(data)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}

