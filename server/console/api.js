// The server's API as the console calls it: the key (kept in this browser's localStorage, sent only as
// an `Authorization: Bearer` header, never in a URL), JSON calls, and OpenAI-style SSE streams.

const KEY_STORAGE = "radixserve.apiKey";

export class APIError extends Error {
  constructor(status, body) {
    const message = body && body.error ? body.error.message : `HTTP ${status}`;
    super(message);
    this.status = status;
    this.body = body;
  }
}

export const apiKey = {
  get: () => localStorage.getItem(KEY_STORAGE) || "",
  set: (key) => (key ? localStorage.setItem(KEY_STORAGE, key) : localStorage.removeItem(KEY_STORAGE)),
};

// Called when a call comes back 401: the app asks for the key (app.js sets it).
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

function headers(extra = {}) {
  const key = apiKey.get();
  return { ...(key ? { Authorization: `Bearer ${key}` } : {}), ...extra };
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    /* not JSON */
  }
  if (response.status === 401) onUnauthorized();
  return new APIError(response.status, body);
}

export async function getJSON(path, { signal } = {}) {
  const response = await fetch(path, { headers: headers(), signal });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function sendJSON(method, path, body, { signal } = {}) {
  const response = await fetch(path, {
    method,
    headers: headers({ "Content-Type": "application/json" }),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function getText(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.text();
}

// POST a JSON body with upload progress (XMLHttpRequest: fetch reports none). onProgress(sentFraction).
export function sendJSONWithProgress(path, body, onProgress) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", path);
    for (const [name, value] of Object.entries(headers({ "Content-Type": "application/json" }))) {
      request.setRequestHeader(name, value);
    }
    request.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    };
    request.upload.onload = () => onProgress(1);
    request.onload = () => {
      let parsed = null;
      try {
        parsed = JSON.parse(request.responseText);
      } catch (_) {
        /* not JSON */
      }
      if (request.status >= 200 && request.status < 300) return resolve(parsed);
      if (request.status === 401) onUnauthorized();
      reject(new APIError(request.status, parsed));
    };
    request.onerror = () => reject(new APIError(0, null));
    request.send(JSON.stringify(body));
  });
}

// POST a streamed request; calls onChunk(parsed JSON) for each `data:` event until `[DONE]`.
export async function stream(path, body, onChunk, { signal } = {}) {
  const response = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new APIError(500, chunk);
      onChunk(chunk);
    }
  }
}
