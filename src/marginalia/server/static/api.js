// The server's HTTP API as the page uses it: JSON calls that carry the key, errors in the API's one shape,
// and server-sent events read from a fetch (EventSource can neither POST nor send the key).

const KEY = "marginalia.server-key";

/** An error reply: `{"error": {"code", "message"}}` with its HTTP status. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function serverKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setServerKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(json) {
  const out = {};
  if (json) out["Content-Type"] = "application/json";
  const key = serverKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

async function errorOf(reply) {
  let body = null;
  try {
    body = await reply.json();
  } catch {
    // not JSON: a proxy's page, say
  }
  const error = body && body.error;
  return new ApiError(reply.status, error ? error.code : "http_error",
                      error ? error.message : `${reply.status} ${reply.statusText}`);
}

async function send(method, path, body, signal) {
  const form = body instanceof FormData;
  const reply = await fetch(path, {
    method,
    headers: headers(body !== undefined && !form),
    body: body === undefined ? undefined : form ? body : JSON.stringify(body),
    signal,
  });
  if (!reply.ok) throw await errorOf(reply);
  return reply;
}

/** A JSON call; throws `ApiError` for an error reply. */
export async function call(method, path, body, signal) {
  return (await send(method, path, body, signal)).json();
}

/** A call sent as the page goes away (it outlives the page); its reply is not read. */
export function callOnLeave(method, path) {
  fetch(path, { method, headers: headers(false), keepalive: true }).catch(() => {});
}

/** A call whose reply is a stream of server-sent events: resolves to the reply (its headers are there)
 * and an async iterator of `{event, data}` with `data` decoded from JSON. */
export async function stream(method, path, body, signal) {
  const reply = await send(method, path, body, signal);
  return { reply, events: readEvents(reply.body) };
}

/** Server-sent events from a byte stream: one `{event, data}` per block (comments and pings skipped). */
export async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const parsed = parseBlock(block);
        if (parsed) yield parsed;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return null;
  const raw = data.join("\n");
  try {
    return { event, data: JSON.parse(raw) };
  } catch {
    return { event, data: raw };
  }
}

/** A path part, escaped (document names may hold spaces and other characters). */
export function part(name) {
  return encodeURIComponent(name);
}
