import { afterEach, describe, expect, it, vi } from "vitest";
import { ApiError } from "./api";
import { Turn } from "./turn";

function chunk(content: string, finish: string | null = null): string {
  return `data: ${JSON.stringify({ id: "chatcmpl-1", choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
}

/** An SSE body that sends `frames`, then breaks (or ends, given `end`). */
function body(frames: string[], end = false): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const left = [...frames];
  return new ReadableStream({
    pull(controller) {
      const frame = left.shift();
      if (frame !== undefined) controller.enqueue(encoder.encode(frame));
      else if (end) controller.close();
      else controller.error(new TypeError("network error"));
    },
  });
}

const routeHeaders = {
  "x-request-id": "chatcmpl-1",
  "x-llmmesh-route-reason": "difficulty",
  "x-llmmesh-route-model": "sim-large",
  "x-llmmesh-route-detail": "a long question",
};

afterEach(() => vi.unstubAllGlobals());

describe("Turn", () => {
  it("resumes a broken stream after the last event it received", async () => {
    const calls: [string, string][] = [];
    vi.stubGlobal("fetch", async (path: string, init: RequestInit) => {
      calls.push([init.method || "GET", path]);
      if (calls.length === 1) return new Response(body([chunk("Hello"), chunk(" wor")]), { headers: routeHeaders });
      return new Response(body([chunk("ld", "stop"), "data: [DONE]\n\n"], true));
    });
    const pieces: string[] = [];
    const turn = new Turn("sk-x", "/v1/conversations/c/messages", { content: "hi" }, { text: (p) => pieces.push(p) }, 0);
    const outcome = await turn.run();
    expect(pieces.join("")).toBe("Hello world");
    expect(calls).toEqual([
      ["POST", "/v1/conversations/c/messages"],
      ["GET", "/v1/streams/chatcmpl-1?starting_after=1"],
    ]);
    expect(outcome).toMatchObject({
      id: "chatcmpl-1",
      finish: "stop",
      resumes: 1,
      route: { reason: "difficulty", model: "sim-large", detail: "a long question" },
    });
  });

  it("throws the edge's refusal as an ApiError", async () => {
    const refusal = { error: { type: "rate_limit_error", code: "rate_limited", message: "slow down" } };
    vi.stubGlobal("fetch", async () => new Response(JSON.stringify(refusal), { status: 429 }));
    const turn = new Turn("sk-x", "/v1/conversations/c/messages", { content: "hi" });
    const err = await turn.run().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(429);
    expect((err as ApiError).message).toBe("429 rate_limit_error (rate_limited): slow down");
  });

  it("stops by cancelling the stream on the edge", async () => {
    const calls: string[] = [];
    let finish: (frames: string[]) => void = () => undefined;
    vi.stubGlobal("fetch", async (path: string, init: RequestInit) => {
      calls.push(`${init.method} ${path}`);
      if (path.endsWith("/cancel")) {
        finish([chunk("", "cancelled"), "data: [DONE]\n\n"]);
        return new Response("{}");
      }
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(new TextEncoder().encode(chunk("Hel")));
          finish = (frames) => {
            for (const f of frames) controller.enqueue(new TextEncoder().encode(f));
            controller.close();
          };
        },
      });
      return new Response(stream, { headers: routeHeaders });
    });
    const turn = new Turn("sk-x", "/p", {}, { text: () => turn.stop() });
    const outcome = await turn.run();
    expect(outcome.finish).toBe("cancelled");
    expect(calls).toEqual(["POST /p", "POST /v1/streams/chatcmpl-1/cancel"]);
  });
});
