"use strict";
// Calls to this edge's own API (relative paths only) and its OpenAI error
// objects as readable text. Shared by the chat page and the operator page.
(function () {
  class ApiError extends Error {
    constructor(status, body, fallback) {
      super(describe(status, body, fallback));
      this.status = status;
      this.body = body;
    }
  }

  function describe(status, body, fallback) {
    const e = body && typeof body === "object" ? body.error : null;
    if (e && typeof e === "object") {
      let text = `${status ? status + " " : ""}${e.type || "error"}`;
      if (e.code) text += ` (${e.code})`;
      text += `: ${e.message || "no message"}`;
      if (e.param) text += ` [param: ${e.param}]`;
      return text;
    }
    return fallback || `${status}: the edge answered without an error object`;
  }

  async function send(key, method, path, options) {
    const opts = options || {};
    const headers = Object.assign({ Authorization: "Bearer " + key }, opts.headers || {});
    let body;
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.json);
    } else if (opts.form) {
      body = opts.form;
    }
    try {
      return await fetch(path, { method, headers, body, credentials: "omit", cache: "no-store" });
    } catch (err) {
      throw new ApiError(0, null, "the edge cannot be reached: " + err.message);
    }
  }

  async function readJson(resp) {
    let body = null;
    try {
      body = await resp.json();
    } catch (err) {
      body = null;
    }
    if (!resp.ok) throw new ApiError(resp.status, body);
    return body;
  }

  async function call(key, method, path, options) {
    return readJson(await send(key, method, path, options));
  }

  // The JSON payloads of an SSE answer, up to `data: [DONE]`; an error
  // answer (before or inside the stream) is thrown as an ApiError.
  async function* events(resp) {
    if (!resp.ok) await readJson(resp);
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
      let end;
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
        const payload = JSON.parse(data);
        // An error event ends the stream (the answer's status was already 200).
        if (payload && payload.error) throw new ApiError(0, payload);
        yield payload;
      }
    }
    throw new ApiError(0, null, "the stream ended before [DONE]");
  }

  function randomId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // An element with text (never markup) and attributes.
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  window.LLMMesh = { ApiError, call, send, events, randomId, el, describe };
})();
