// One streamed conversation turn: POST it as a resumable stream, hand each
// piece of text to the page, and, when the connection breaks, follow the
// same stream again from the last event received (GET /v1/streams/{id}).
// Stop asks the edge to cancel the stream (POST /v1/streams/{id}/cancel),
// which ends it with finish_reason "cancelled" and what was made so far.
import { ApiError, StreamBroken, events, send } from "./api";

/** How the region chose the turn's model (the x-llmmesh-route-* headers). */
export interface Route {
  reason: string;
  model: string;
  detail: string;
}

export interface Citation {
  marker: string;
  filename: string;
  file_id?: string;
}

export interface TurnHandlers {
  /** The stream's id (its completion id) and the route, once the edge has answered. */
  started?(id: string, route: Route | null): void;
  text?(piece: string): void;
}

export interface TurnOutcome {
  id: string | null;
  route: Route | null;
  finish: string | null;
  citations: Citation[];
  retrievalDegraded: boolean;
  resumes: number;
}

const RESUMES = 3;

export class Turn {
  private readonly abort = new AbortController();
  private streamId: string | null = null;
  private stopAsked = false;

  constructor(
    private readonly key: string,
    private readonly path: string,
    private readonly body: Record<string, unknown>,
    private readonly handlers: TurnHandlers = {},
    private readonly pauseMs = 400,
  ) {}

  /** Runs the turn to its end; a refusal (a 429, say) is thrown as an ApiError. */
  async run(): Promise<TurnOutcome> {
    const outcome: TurnOutcome = {
      id: null,
      route: null,
      finish: null,
      citations: [],
      retrievalDegraded: false,
      resumes: 0,
    };
    const headers = { Accept: "text/event-stream", "x-llmmesh-resumable": "true" };
    let resp = await send(this.key, "POST", this.path, { json: this.body, headers, signal: this.abort.signal });
    if (!resp.ok) await events(resp).next();
    this.streamId = outcome.id = resp.headers.get("x-request-id");
    outcome.route = routeOf(resp.headers);
    this.handlers.started?.(outcome.id || "", outcome.route);
    if (this.stopAsked) void this.cancel();
    let received = 0;
    for (;;) {
      try {
        for await (const chunk of events(resp)) {
          received += 1;
          this.take(chunk, outcome);
        }
        return outcome;
      } catch (err) {
        if (!(err instanceof StreamBroken) || !this.streamId || outcome.resumes >= RESUMES) throw err;
      }
      outcome.resumes += 1;
      await new Promise((resolve) => setTimeout(resolve, this.pauseMs * outcome.resumes));
      const after = received > 0 ? `?starting_after=${received - 1}` : "";
      resp = await send(this.key, "GET", `/v1/streams/${encodeURIComponent(this.streamId)}${after}`, {
        headers: { Accept: "text/event-stream" },
        signal: this.abort.signal,
      });
    }
  }

  /** Stop: the edge cancels the stream, which then ends as usual (asked as soon as the stream has an id). */
  stop(): void {
    this.stopAsked = true;
    if (this.streamId) void this.cancel();
  }

  /** Leave the turn (the page signs out): stop reading. */
  drop(): void {
    this.abort.abort();
  }

  private async cancel(): Promise<void> {
    try {
      const resp = await send(this.key, "POST", `/v1/streams/${encodeURIComponent(this.streamId || "")}/cancel`);
      if (!resp.ok) throw new ApiError(resp.status, null);
    } catch {
      // The edge could not cancel it: at least stop reading.
      this.abort.abort();
    }
  }

  private take(chunk: Record<string, unknown>, outcome: TurnOutcome): void {
    const choices = (chunk.choices as { delta?: { content?: string }; finish_reason?: string }[]) || [];
    for (const choice of choices) {
      const piece = choice.delta?.content;
      if (piece) this.handlers.text?.(piece);
      if (choice.finish_reason) outcome.finish = choice.finish_reason;
    }
    if (Array.isArray(chunk.llmmesh_citations)) outcome.citations = chunk.llmmesh_citations as Citation[];
    if (chunk.llmmesh_retrieval_degraded) outcome.retrievalDegraded = true;
  }
}

function routeOf(headers: Headers): Route | null {
  const reason = headers.get("x-llmmesh-route-reason");
  if (!reason) return null;
  return {
    reason,
    model: headers.get("x-llmmesh-route-model") || "",
    detail: headers.get("x-llmmesh-route-detail") || "",
  };
}
