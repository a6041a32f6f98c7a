// The chat page: sign in with an API key, list / open / delete conversations,
// stream replies (resumed when the connection breaks, stopped on request),
// edit a user message or regenerate a reply (each a new branch), switch
// branches, pick the model (or leave it to the region: auto), upload a file.
// Uploaded files go into the key's "web chat files" vector store, which every
// turn then searches (llmmesh_retrieval); a reply shows the files it cited.
import { ApiError, byId, call, clearError, el, randomId, showError } from "./api";
import {
  type StoredMessage,
  annotate,
  atEnd,
  bubble,
  copyButton,
  fill,
  replyNotes,
  titleOf,
} from "./thread";
import { Turn } from "./turn";

interface Conversation {
  id: string;
  title: string | null;
}

interface Branch {
  leaf_id: string;
  message_count: number;
  current: boolean;
}

interface Page<T> {
  data: T[];
  has_more: boolean;
  last_id: string | null;
}

const KEY = "llmmesh.apiKey";
const MODEL = "llmmesh.model";
const PAGE = 100;
const MAX_PAGES = 50;
const STORE_NAME = "web chat files";
const PHONE = window.matchMedia("(max-width: 720px)");

const state = {
  key: null as string | null,
  conversation: null as Conversation | null,
  leaf: null as string | null,
  messages: [] as StoredMessage[],
  branches: [] as Branch[],
  editing: null as string | null,
  turn: null as Turn | null,
  store: null as string | null,
  pinned: true,
};

const $ = byId;
const input = (id: string): HTMLInputElement => byId<HTMLInputElement>(id);
const messagesBox = (): HTMLElement => $("messages");

function guard<A extends unknown[]>(action: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args: A) => {
    const event = args[0];
    if (event instanceof Event) event.preventDefault();
    clearError();
    try {
      await action(...args);
    } catch (err) {
      if (err instanceof DOMException && err.name === "AbortError") return;
      showError(err);
    }
  };
}

function api<T>(method: string, path: string, opts?: Parameters<typeof call>[3]): Promise<T> {
  return call<T>(state.key || "", method, path, opts);
}

/** Every page of a list (bounded), oldest page first. */
async function listAll<T>(path: string): Promise<T[]> {
  const items: T[] = [];
  let after: string | null = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    const sep = path.includes("?") ? "&" : "?";
    const url = `${path}${sep}limit=${PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
    const body: Page<T> = await api<Page<T>>("GET", url);
    items.push(...body.data);
    if (!body.has_more || !body.last_id) break;
    after = body.last_id;
  }
  return items;
}

function busy(): boolean {
  return state.turn !== null;
}

function showBusy(): void {
  const on = busy();
  byId<HTMLButtonElement>("send").disabled = on;
  $("stop").hidden = !on;
  messagesBox()
    .querySelectorAll<HTMLButtonElement>("button.edit, button.regenerate, button.retry")
    .forEach((b) => (b.disabled = on));
}

// ---- sign in

async function signIn(key: string): Promise<void> {
  state.key = key;
  let models: Page<{ id: string; kind?: string }>;
  try {
    models = await api<Page<{ id: string; kind?: string }>>("GET", "/v1/models");
  } catch (err) {
    state.key = null;
    sessionStorage.removeItem(KEY);
    throw err;
  }
  sessionStorage.setItem(KEY, key);
  // Embedding models take no chat turn: the picker lists chat models only.
  showModels(models.data.filter((m) => m.kind !== "embedding").map((m) => m.id));
  state.store = await findStore();
  $("signin").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  $("prompt").focus();
  await loadConversations();
  const wanted = new URLSearchParams(location.hash.slice(1)).get("c");
  if (wanted) await openConversation(wanted);
}

function signOut(): void {
  state.turn?.drop();
  sessionStorage.removeItem(KEY);
  state.key = null;
  state.store = null;
  location.hash = "";
  newChat();
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("signin").hidden = false;
  input("api-key").value = "";
}

function showModels(ids: string[]): void {
  const select = byId<HTMLSelectElement>("model");
  const wanted = sessionStorage.getItem(MODEL) || "auto";
  const names = ["auto", ...ids.filter((id) => id !== "auto")];
  select.replaceChildren(...names.map((id) => el("option", { value: id }, id)));
  select.value = names.includes(wanted) ? wanted : "auto";
}

// ---- conversations

async function loadConversations(): Promise<void> {
  const list = await listAll<Conversation>("/v1/conversations");
  const items = list.map((c) => {
    const title = c.title || c.id;
    const li = el("li", { "data-id": c.id, class: "conversation" });
    if (state.conversation?.id === c.id) li.classList.add("active");
    const open = el("button", { type: "button", class: "open", title }, title);
    if (state.conversation?.id === c.id) open.setAttribute("aria-current", "true");
    open.addEventListener("click", guard(() => openConversation(c.id)));
    const label = `Delete conversation ${title}`;
    const del = el("button", { type: "button", class: "delete", "aria-label": label, title: label }, "✕");
    del.addEventListener("click", () => confirmDelete(c.id, title));
    li.append(open, del);
    return li;
  });
  $("conversations").replaceChildren(...items);
}

function markActive(id: string | null): void {
  document.querySelectorAll<HTMLElement>("#conversations li").forEach((li) => {
    const active = li.dataset.id === id;
    li.classList.toggle("active", active);
    const open = li.querySelector(".open");
    if (active) open?.setAttribute("aria-current", "true");
    else open?.removeAttribute("aria-current");
  });
}

function newChat(): void {
  state.conversation = null;
  state.leaf = null;
  state.messages = [];
  state.branches = [];
  cancelEdit();
  history.replaceState(null, "", location.pathname);
  $("title").textContent = "New chat";
  renderBranches();
  renderMessages();
  markActive(null);
  closeMenu();
}

async function openConversation(id: string, leaf?: string): Promise<void> {
  state.conversation = await api<Conversation>("GET", `/v1/conversations/${encodeURIComponent(id)}`);
  history.replaceState(null, "", `#c=${encodeURIComponent(id)}`);
  $("title").textContent = state.conversation.title || state.conversation.id;
  cancelEdit();
  markActive(id);
  closeMenu();
  await loadBranches(leaf);
  await loadMessages();
}

function confirmDelete(id: string, title: string): void {
  const dialog = byId<HTMLDialogElement>("confirm-delete");
  $("confirm-delete-text").textContent = `Delete “${title}”? This cannot be undone.`;
  dialog.returnValue = "";
  dialog.onclose = () => {
    if (dialog.returnValue === "delete") void guard(() => deleteConversation(id))();
  };
  dialog.showModal();
  $("confirm-delete-cancel").focus();
}

async function deleteConversation(id: string): Promise<void> {
  await api("DELETE", `/v1/conversations/${encodeURIComponent(id)}`);
  if (state.conversation?.id === id) newChat();
  await loadConversations();
}

function conversationPath(suffix: string): string {
  return `/v1/conversations/${encodeURIComponent(state.conversation?.id || "")}${suffix}`;
}

// ---- branches and messages

async function loadBranches(leaf?: string): Promise<void> {
  state.branches = await listAll<Branch>(conversationPath("/branches"));
  const current = state.branches.find((b) => b.current);
  if (leaf && state.branches.some((b) => b.leaf_id === leaf)) state.leaf = leaf;
  else state.leaf = current ? current.leaf_id : null;
  renderBranches();
}

function renderBranches(): void {
  const options = state.branches.map((b, i) => {
    const label = `${i + 1}: ${b.message_count} messages${b.current ? " (latest)" : ""}`;
    const option = el("option", { value: b.leaf_id }, label);
    option.selected = b.leaf_id === state.leaf;
    return option;
  });
  byId<HTMLSelectElement>("branches").replaceChildren(...options);
  $("branch-picker").hidden = state.branches.length < 2;
}

async function loadMessages(): Promise<void> {
  const leaf = state.leaf ? `?leaf_id=${encodeURIComponent(state.leaf)}` : "";
  state.messages = state.leaf ? await listAll<StoredMessage>(conversationPath(`/messages${leaf}`)) : [];
  renderMessages();
  scrollToEnd();
}

function messageBubble(m: StoredMessage): HTMLDivElement {
  const div = bubble(m.role, m.id);
  fill(div, m.content || "");
  const actions = el("div", { class: "actions" });
  if (m.role === "assistant") {
    if (m.finish_reason) div.dataset.finish = m.finish_reason;
    if (m.finish_reason && m.finish_reason !== "stop") {
      div.querySelector(".content")?.after(el("div", { class: "finish" }, `finished: ${m.finish_reason}`));
    }
    annotate(div, m.model, replyNotes.get(m.request_id));
    const again = el("button", { type: "button", class: "regenerate" }, "Regenerate");
    again.addEventListener("click", guard(() => regenerate(m)));
    actions.append(copyButton(m.content || ""), again);
  } else if (m.role === "user") {
    const edit = el("button", { type: "button", class: "edit" }, "Edit");
    edit.addEventListener("click", () => startEdit(m));
    actions.append(edit);
  }
  div.append(actions);
  return div;
}

function renderMessages(upTo?: number): HTMLElement {
  const shown = upTo === undefined ? state.messages : state.messages.slice(0, upTo);
  const box = messagesBox();
  box.replaceChildren(
    ...shown.filter((m) => m.role !== "system" && m.role !== "developer" && m.role !== "tool").map(messageBubble),
  );
  showBusy();
  return box;
}

function startEdit(message: StoredMessage): void {
  state.editing = message.id;
  byId<HTMLTextAreaElement>("prompt").value = message.content || "";
  $("editing").hidden = false;
  $("prompt").focus();
}

function cancelEdit(): void {
  state.editing = null;
  $("editing").hidden = true;
}

// ---- scrolling: the view follows the newest text unless the reader scrolled up

function scrollToEnd(): void {
  const box = messagesBox();
  box.scrollTop = box.scrollHeight;
  state.pinned = true;
  $("to-newest").hidden = true;
}

function follow(): void {
  if (state.pinned) messagesBox().scrollTop = messagesBox().scrollHeight;
  else $("to-newest").hidden = false;
}

// ---- turns

interface TurnRequest {
  path: string;
  body: Record<string, unknown>;
  before: number;
  userText: string | null;
}

async function runTurn(request: TurnRequest): Promise<void> {
  const box = renderMessages(request.before);
  if (request.userText !== null) {
    const mine = bubble("user");
    fill(mine, request.userText);
    box.append(mine);
  }
  const reply = bubble("assistant");
  reply.classList.add("streaming");
  reply.dataset.chunks = "0";
  box.append(reply);
  scrollToEnd();
  let text = "";
  let drawn = false;
  const draw = (): void => {
    drawn = false;
    fill(reply, text);
    follow();
  };
  const model = byId<HTMLSelectElement>("model").value;
  const body = { stream: true, client_message_id: randomId(), model, ...retrieval(), ...request.body };
  const turn = new Turn(state.key || "", request.path, body, {
    started: (_id, route) => annotate(reply, route?.model || null, { route }),
    text: (piece) => {
      text += piece;
      reply.dataset.chunks = String(Number(reply.dataset.chunks) + 1);
      if (!drawn) {
        drawn = true;
        requestAnimationFrame(draw);
      }
    },
  });
  state.turn = turn;
  showBusy();
  let failed: unknown = null;
  try {
    const outcome = await turn.run();
    if (outcome.id) {
      replyNotes.put(outcome.id, {
        route: outcome.route,
        citations: outcome.citations,
        retrievalDegraded: outcome.retrievalDegraded,
      });
    }
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") return;
    failed = err;
  } finally {
    state.turn = null;
    showBusy();
  }
  if (failed !== null) {
    showTurnError(reply, failed, request);
    // A turn refused before it began stored nothing; one that broke may have stored a part.
    if (!(failed instanceof ApiError) || failed.status === 0) await refreshConversation(true);
    return;
  }
  // The stored tree is the truth: show the branch the turn made.
  await refreshConversation(false);
}

async function refreshConversation(keepError: boolean): Promise<void> {
  if (!state.conversation) return;
  const error = keepError ? messagesBox().querySelector(".turn-error") : null;
  await loadBranches();
  await loadMessages();
  await loadConversations();
  if (error) {
    messagesBox().append(error);
    scrollToEnd();
  }
}

/** In place of the reply: what went wrong, and Retry, which sends the same turn again. */
function showTurnError(reply: HTMLElement, err: unknown, request: TurnRequest): void {
  const box = el("div", { class: "bubble turn-error", role: "alert" });
  box.append(
    el("div", { class: "role" }, "error"),
    el("div", { class: "content" }, err instanceof Error ? err.message : String(err)),
  );
  const retry = el("button", { type: "button", class: "retry" }, "Retry");
  retry.addEventListener("click", guard(() => runTurn(request)));
  const actions = el("div", { class: "actions" });
  actions.append(retry);
  box.append(actions);
  reply.replaceWith(box);
  follow();
}

/** The turn's request to search the uploaded files, once there are any. */
function retrieval(): Record<string, unknown> {
  return state.store ? { llmmesh_retrieval: { vector_store_ids: [state.store] } } : {};
}

async function send(): Promise<void> {
  const promptBox = byId<HTMLTextAreaElement>("prompt");
  const text = promptBox.value;
  if (!text.trim() || busy()) return;
  if (!state.conversation) {
    state.conversation = await api<Conversation>("POST", "/v1/conversations", { json: { title: titleOf(text) } });
    history.replaceState(null, "", `#c=${encodeURIComponent(state.conversation.id)}`);
    $("title").textContent = state.conversation.title || state.conversation.id;
    await loadConversations();
    markActive(state.conversation.id);
  }
  const body: Record<string, unknown> = { content: text };
  let before = state.messages.length;
  if (state.editing) {
    body.edit_id = state.editing;
    before = state.messages.findIndex((m) => m.id === state.editing);
  } else if (state.messages.length) {
    body.parent_id = state.messages[state.messages.length - 1].id;
  }
  promptBox.value = "";
  cancelEdit();
  await runTurn({ path: conversationPath("/messages"), body, before: Math.max(before, 0), userText: text });
}

async function regenerate(message: StoredMessage): Promise<void> {
  if (busy()) return;
  const at = state.messages.findIndex((m) => m.id === message.id);
  const path = conversationPath(`/messages/${encodeURIComponent(message.id)}/regenerate`);
  await runTurn({ path, body: {}, before: at < 0 ? state.messages.length : at, userText: null });
}

// ---- files

/** The key's vector store of uploaded files, if it has one. */
async function findStore(): Promise<string | null> {
  const stores = await listAll<{ id: string; name: string }>("/v1/vector_stores");
  return stores.find((s) => s.name === STORE_NAME)?.id || null;
}

async function upload(): Promise<void> {
  const file = input("file");
  const status = $("upload-status");
  if (!file.files || !file.files.length) throw new Error("choose a file to upload first");
  const form = new FormData();
  form.append("purpose", "assistants");
  form.append("file", file.files[0]);
  status.textContent = "uploading...";
  try {
    const stored = await api<{ id: string; filename: string; bytes: number }>("POST", "/v1/files", { form });
    if (!state.store) state.store = await findStore();
    if (!state.store) {
      state.store = (await api<{ id: string }>("POST", "/v1/vector_stores", { json: { name: STORE_NAME } })).id;
    }
    await api("POST", `/v1/vector_stores/${encodeURIComponent(state.store)}/files`, { json: { file_id: stored.id } });
    status.textContent = `Uploaded ${stored.filename} as ${stored.id} (${stored.bytes} bytes); replies now search your files`;
    status.dataset.fileId = stored.id;
    file.value = "";
  } catch (err) {
    status.textContent = "";
    throw err;
  }
}

// ---- the menu (phones: the conversation list slides over the thread)

function closeMenu(): void {
  document.body.classList.remove("menu-open");
  $("menu").setAttribute("aria-expanded", "false");
}

function toggleMenu(): void {
  const open = document.body.classList.toggle("menu-open");
  $("menu").setAttribute("aria-expanded", String(open));
  if (open) $("new-chat").focus();
}

// ---- wiring

$("signin").addEventListener("submit", guard(() => signIn(input("api-key").value.trim())));
$("sign-out").addEventListener("click", () => signOut());
$("new-chat").addEventListener("click", () => {
  newChat();
  $("prompt").focus();
});
$("menu").hidden = false;
$("menu").addEventListener("click", () => toggleMenu());
PHONE.addEventListener("change", () => closeMenu());
$("composer").addEventListener("submit", guard(() => send()));
$("prompt").addEventListener("keydown", (event: KeyboardEvent) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    byId<HTMLFormElement>("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.turn?.stop());
$("cancel-edit").addEventListener("click", () => cancelEdit());
$("branches").addEventListener(
  "change",
  guard(async () => {
    state.leaf = byId<HTMLSelectElement>("branches").value;
    await loadMessages();
  }),
);
$("model").addEventListener("change", () => sessionStorage.setItem(MODEL, byId<HTMLSelectElement>("model").value));
messagesBox().addEventListener("scroll", () => {
  state.pinned = atEnd(messagesBox());
  if (state.pinned) $("to-newest").hidden = true;
});
$("to-newest").addEventListener("click", () => scrollToEnd());
$("upload").addEventListener("submit", guard(() => upload()));
const saved = sessionStorage.getItem(KEY);
if (saved) {
  void guard(() => signIn(saved))().then(() => {
    if (!state.key) $("signin").hidden = false;
  });
} else {
  $("signin").hidden = false;
}
