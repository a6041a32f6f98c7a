// Calls to this edge's own API (relative paths only) and its OpenAI error
// objects as readable text. Shared by the chat page and the operator page.

interface ErrorObject {
  type?: string;
  code?: string;
  message?: string;
  param?: string;
}

/** An answer that is not a success, described from the edge's error object. */
export class ApiError extends Error {
  readonly status: number;
  readonly body: unknown;

  constructor(status: number, body: unknown, fallback?: string) {
    super(describe(status, body, fallback));
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

/** "429 rate_limit_error (rate_limited): message [param: x]", or `fallback`. */
export function describe(status: number, body: unknown, fallback?: string): string {
  const e = body && typeof body === "object" ? (body as { error?: unknown }).error : null;
  if (e && typeof e === "object") {
    const err = e as ErrorObject;
    let text = `${status ? `${status} ` : ""}${err.type || "error"}`;
    if (err.code) text += ` (${err.code})`;
    text += `: ${err.message || "no message"}`;
    if (err.param) text += ` [param: ${err.param}]`;
    return text;
  }
  return fallback || `${status}: the edge answered without an error object`;
}

export interface SendOptions {
  json?: unknown;
  form?: FormData;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** One request with the key as a bearer token; the edge unreachable is an ApiError of status 0. */
export async function send(key: string, method: string, path: string, opts: SendOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { Authorization: `Bearer ${key}`, ...opts.headers };
  let body: BodyInit | undefined;
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.json);
  } else if (opts.form) {
    body = opts.form;
  }
  try {
    return await fetch(path, { method, headers, body, credentials: "omit", cache: "no-store", signal: opts.signal });
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, null, `the edge cannot be reached: ${(err as Error).message}`);
  }
}

/** The JSON body of a success; an ApiError otherwise. */
export async function readJson<T>(resp: Response): Promise<T> {
  let body: unknown = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body as T;
}

export async function call<T>(key: string, method: string, path: string, opts?: SendOptions): Promise<T> {
  return readJson<T>(await send(key, method, path, opts));
}

/** The stream ended without `[DONE]` or its connection broke: it may be resumed. */
export class StreamBroken extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StreamBroken";
  }
}

/**
 * The JSON payloads of an SSE answer, up to `data: [DONE]`. An error answer
 * (before or inside the stream) is thrown as an ApiError; a connection that
 * breaks or ends early as StreamBroken.
 */
export async function* events(resp: Response): AsyncGenerator<Record<string, unknown>> {
  if (!resp.ok) await readJson(resp);
  if (!resp.body) throw new StreamBroken("the answer has no body");
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (err instanceof DOMException && err.name === "AbortError") throw err;
        throw new StreamBroken(`the stream broke: ${(err as Error).message}`);
      }
      if (chunk.done) break;
      buffer = (buffer + decoder.decode(chunk.value, { stream: true })).replace(/\r\n/g, "\n");
      let end: number;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const payload = JSON.parse(data) as Record<string, unknown>;
        // An error event ends the stream (the answer's status was already 200).
        if (payload && payload.error) throw new ApiError(0, payload);
        yield payload;
      }
    }
  } finally {
    reader.releaseLock();
  }
  throw new StreamBroken("the stream ended before [DONE]");
}

export function randomId(): string {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** An element with text (never markup) and attributes. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  text?: string | number | null,
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/** The element with this id; a page missing it is a bug, so it throws. */
export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node as T;
}

/** The error box at the top of a page. */
export function showError(err: unknown): void {
  const box = byId("error");
  box.textContent = err instanceof Error ? err.message : String(err);
  box.hidden = false;
}

export function clearError(): void {
  const box = byId("error");
  box.hidden = true;
  box.textContent = "";
}
