// The messages of a conversation as the chat page shows them: a user's text
// as text, a reply's as rendered markdown with the model that served it, the
// region's reason for that model and the files it cited.
import { el } from "./api";
import { copyLabel, copyText, showMarkdown } from "./markdown";
import type { Citation, Route } from "./turn";

export interface StoredMessage {
  id: string;
  role: string;
  content: string | null;
  request_id: string | null;
  model: string | null;
  finish_reason: string | null;
  parent_id?: string | null;
}

/** What the page learnt about a reply while it streamed, which the stored message does not hold. */
export interface ReplyNote {
  route?: Route | null;
  citations?: Citation[];
  retrievalDegraded?: boolean;
}

const NOTES = "llmmesh.replyNotes";
const MAX_NOTES = 500;

/** The notes of this tab's replies, by request id, so that a reload still shows them. */
export const replyNotes = {
  all(): Record<string, ReplyNote> {
    try {
      return JSON.parse(sessionStorage.getItem(NOTES) || "{}") as Record<string, ReplyNote>;
    } catch {
      return {};
    }
  },
  get(requestId: string | null): ReplyNote | undefined {
    return requestId ? this.all()[requestId] : undefined;
  },
  put(requestId: string, note: ReplyNote): void {
    const notes = this.all();
    notes[requestId] = note;
    const ids = Object.keys(notes);
    for (const old of ids.slice(0, Math.max(0, ids.length - MAX_NOTES))) delete notes[old];
    sessionStorage.setItem(NOTES, JSON.stringify(notes));
  },
};

/** "Tell me how the mesh keeps…": the first words of a first message, as a conversation's title. */
export function titleOf(text: string, max = 48): string {
  const words = text.trim().split(/\s+/).filter(Boolean);
  let title = "";
  for (const word of words) {
    const next = title ? `${title} ${word}` : word;
    if (next.length > max) return title ? `${title}…` : `${word.slice(0, max - 1)}…`;
    title = next;
  }
  return title || "New chat";
}

/** A bubble for one message; `content` is filled by `fill`. */
export function bubble(role: string, id?: string): HTMLDivElement {
  const div = el("div", { class: `bubble message ${role}`, "data-role": role });
  if (id) div.dataset.id = id;
  div.append(el("div", { class: "role" }, role === "assistant" ? "assistant" : role), el("div", { class: "content" }));
  return div;
}

/** Sets a bubble's text: markdown for a reply, plain text otherwise. */
export function fill(div: HTMLElement, text: string): void {
  const content = div.querySelector<HTMLElement>(".content");
  if (!content) return;
  if (div.dataset.role === "assistant") showMarkdown(content, text);
  else content.textContent = text;
}

/** The line under a reply: which model served it and why. */
export function describeRoute(model: string | null, route: Route | null | undefined): string {
  if (route) return `${route.model || model || "model"} · route: ${route.reason}${route.detail ? ` (${route.detail})` : ""}`;
  return model ? `${model}` : "";
}

/** The files a reply's context cited, or why none could be searched. */
export function describeSources(note: ReplyNote | undefined): string {
  if (!note) return "";
  if (note.retrievalDegraded) return "Sources: your files could not be searched for this reply";
  if (!note.citations || !note.citations.length) return "";
  return `Sources: ${note.citations.map((c) => `${c.marker} ${c.filename}`).join(", ")}`;
}

/** Adds (or replaces) a reply's model, route and sources lines. */
export function annotate(div: HTMLElement, model: string | null, note: ReplyNote | undefined): void {
  div.querySelectorAll(".meta, .sources").forEach((n) => n.remove());
  const content = div.querySelector(".content");
  const sources = describeSources(note);
  if (sources) content?.after(el("div", { class: "sources" }, sources));
  const route = describeRoute(model, note?.route);
  if (route) div.querySelector(".role")?.after(el("div", { class: "meta route" }, route));
}

/** A "Copy" button for a whole message's text. */
export function copyButton(text: string): HTMLButtonElement {
  const button = copyLabel("copy", "message");
  button.addEventListener("click", () => void copyText(text, button));
  return button;
}

/** Whether `box` is scrolled to (or within a few pixels of) its end. */
export function atEnd(box: HTMLElement): boolean {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 48;
}
