"use strict";
// The chat page: sign in with an API key, list / open / delete conversations,
// stream replies over SSE, edit a user message or regenerate a reply (each a
// new branch), switch branches, upload a file. Uploaded files go into the
// key's "web chat files" vector store, which every turn then searches
// (llmmesh_retrieval); a reply shows the files it cited. Text is always set
// as text.
(function () {
  const api = window.LLMMesh;
  const el = api.el;
  const KEY = "llmmesh.apiKey";
  const PAGE = 100;
  const MAX_PAGES = 50;
  const $ = (id) => document.getElementById(id);
  const state = {
    key: null,
    conversation: null,
    leaf: null,
    messages: [],
    branches: [],
    editing: null,
    busy: false,
    controller: null,
    store: null,
  };
  const STORE_NAME = "web chat files";

  function showError(err) {
    const box = $("error");
    box.textContent = err instanceof Error ? err.message : String(err);
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  function guard(action) {
    return async (event) => {
      if (event) event.preventDefault();
      clearError();
      try {
        await action(event);
      } catch (err) {
        if (err && err.name === "AbortError") return;
        showError(err);
      }
    };
  }

  function call(method, path, options) {
    return api.call(state.key, method, path, options);
  }

  // Every page of a list (bounded), oldest page first.
  async function listAll(path) {
    const items = [];
    let after = null;
    for (let page = 0; page < MAX_PAGES; page++) {
      const sep = path.includes("?") ? "&" : "?";
      const url = `${path}${sep}limit=${PAGE}` + (after ? `&after=${encodeURIComponent(after)}` : "");
      const body = await call("GET", url);
      items.push(...body.data);
      if (!body.has_more || !body.last_id) break;
      after = body.last_id;
    }
    return items;
  }

  function setBusy(busy) {
    state.busy = busy;
    $("send").disabled = busy;
    $("stop").hidden = !busy;
    document.querySelectorAll("#messages button").forEach((b) => (b.disabled = busy));
  }

  // ---- sign in

  async function signIn(key) {
    state.key = key;
    try {
      await call("GET", "/v1/models");
    } catch (err) {
      state.key = null;
      sessionStorage.removeItem(KEY);
      throw err;
    }
    sessionStorage.setItem(KEY, key);
    state.store = await findStore();
    $("signin").hidden = true;
    $("app").hidden = false;
    $("sign-out").hidden = false;
    await loadConversations();
    const wanted = new URLSearchParams(location.hash.slice(1)).get("c");
    if (wanted) await openConversation(wanted);
  }

  function signOut() {
    if (state.controller) state.controller.abort();
    sessionStorage.removeItem(KEY);
    state.key = null;
    state.store = null;
    location.hash = "";
    newChat();
    $("app").hidden = true;
    $("sign-out").hidden = true;
    $("signin").hidden = false;
    $("api-key").value = "";
  }

  // ---- conversations

  async function loadConversations() {
    const list = await listAll("/v1/conversations");
    const ul = $("conversations");
    ul.replaceChildren();
    for (const c of list) {
      const li = el("li", { "data-id": c.id, class: "conversation" });
      if (state.conversation && state.conversation.id === c.id) li.classList.add("active");
      const open = el("button", { type: "button", class: "open" }, c.title || c.id);
      open.addEventListener("click", guard(() => openConversation(c.id)));
      const del = el("button", { type: "button", class: "delete", title: "Delete" }, "Delete");
      del.addEventListener("click", guard(() => deleteConversation(c.id)));
      li.append(open, del);
      ul.append(li);
    }
  }

  function newChat() {
    state.conversation = null;
    state.leaf = null;
    state.messages = [];
    state.branches = [];
    cancelEdit();
    history.replaceState(null, "", location.pathname);
    $("title").textContent = "New chat";
    renderBranches();
    renderMessages();
    document.querySelectorAll("#conversations li").forEach((li) => li.classList.remove("active"));
  }

  async function openConversation(id, leaf) {
    state.conversation = await call("GET", `/v1/conversations/${encodeURIComponent(id)}`);
    history.replaceState(null, "", `#c=${encodeURIComponent(id)}`);
    $("title").textContent = state.conversation.title || state.conversation.id;
    cancelEdit();
    document.querySelectorAll("#conversations li").forEach((li) => {
      li.classList.toggle("active", li.dataset.id === id);
    });
    await loadBranches(leaf);
    await loadMessages();
  }

  async function deleteConversation(id) {
    await call("DELETE", `/v1/conversations/${encodeURIComponent(id)}`);
    if (state.conversation && state.conversation.id === id) newChat();
    await loadConversations();
  }

  function conversationPath(suffix) {
    return `/v1/conversations/${encodeURIComponent(state.conversation.id)}${suffix}`;
  }

  // ---- branches and messages

  async function loadBranches(leaf) {
    state.branches = await listAll(conversationPath("/branches"));
    const current = state.branches.find((b) => b.current);
    if (leaf && state.branches.some((b) => b.leaf_id === leaf)) state.leaf = leaf;
    else state.leaf = current ? current.leaf_id : null;
    renderBranches();
  }

  function renderBranches() {
    const select = $("branches");
    select.replaceChildren();
    state.branches.forEach((b, i) => {
      const label = `Branch ${i + 1}: ${b.message_count} messages${b.current ? " (latest)" : ""}`;
      const option = el("option", { value: b.leaf_id }, label);
      if (b.leaf_id === state.leaf) option.selected = true;
      select.append(option);
    });
    $("branch-picker").hidden = state.branches.length < 2;
  }

  async function loadMessages() {
    const leaf = state.leaf ? `?leaf_id=${encodeURIComponent(state.leaf)}` : "";
    state.messages = state.leaf ? await listAll(conversationPath("/messages" + leaf)) : [];
    renderMessages();
  }

  function bubble(role, text, id) {
    const div = el("div", { class: `message ${role}`, "data-role": role });
    if (id) div.dataset.id = id;
    div.append(el("div", { class: "role" }, role), el("div", { class: "content" }, text));
    return div;
  }

  function renderMessages(upTo) {
    const shown = upTo === undefined ? state.messages : state.messages.slice(0, upTo);
    const box = $("messages");
    box.replaceChildren();
    for (const m of shown) {
      if (m.role === "system" || m.role === "developer") continue;
      const div = bubble(m.role, m.content || "", m.id);
      if (m.finish_reason) div.dataset.finish = m.finish_reason;
      if (m.finish_reason && m.finish_reason !== "stop") {
        div.append(el("div", { class: "finish" }, `finished: ${m.finish_reason}`));
      }
      const actions = el("div", { class: "actions" });
      if (m.role === "user") {
        const edit = el("button", { type: "button", class: "edit" }, "Edit");
        edit.addEventListener("click", () => startEdit(m));
        actions.append(edit);
      } else if (m.role === "assistant") {
        const again = el("button", { type: "button", class: "regenerate" }, "Regenerate");
        again.addEventListener("click", guard(() => regenerate(m)));
        actions.append(again);
      }
      div.append(actions);
      box.append(div);
    }
    document.querySelectorAll("#messages button").forEach((b) => (b.disabled = state.busy));
    return box;
  }

  function startEdit(message) {
    state.editing = message.id;
    $("prompt").value = message.content || "";
    $("editing").hidden = false;
    $("prompt").focus();
  }

  function cancelEdit() {
    state.editing = null;
    $("editing").hidden = true;
  }

  // ---- turns

  async function streamTurn(path, body, before, userText) {
    const box = renderMessages(before);
    if (userText !== null) box.append(bubble("user", userText));
    const reply = bubble("assistant", "");
    reply.classList.add("streaming");
    reply.dataset.chunks = "0";
    box.append(reply);
    const content = reply.querySelector(".content");
    let citations = [];
    let degraded = false;
    state.controller = new AbortController();
    setBusy(true);
    try {
      const resp = await fetch(path, {
        method: "POST",
        headers: {
          Authorization: "Bearer " + state.key,
          "Content-Type": "application/json",
          Accept: "text/event-stream",
        },
        body: JSON.stringify(
          Object.assign({ stream: true, client_message_id: api.randomId() }, retrieval(), body)
        ),
        credentials: "omit",
        cache: "no-store",
        signal: state.controller.signal,
      });
      for await (const chunk of api.events(resp)) {
        for (const choice of chunk.choices || []) {
          const text = choice.delta && choice.delta.content;
          if (text) {
            content.textContent += text;
            reply.dataset.chunks = String(Number(reply.dataset.chunks) + 1);
          }
          if (choice.finish_reason) reply.dataset.finish = choice.finish_reason;
        }
        if (chunk.llmmesh_citations) citations = chunk.llmmesh_citations;
        if (chunk.llmmesh_retrieval_degraded) degraded = true;
      }
    } catch (err) {
      // Stopped by the user: the edge cancels the turn; show what was stored.
      if (!err || err.name !== "AbortError") throw err;
    } finally {
      state.controller = null;
      setBusy(false);
    }
    // The stored tree is the truth: show the branch the turn made.
    await loadBranches();
    await loadMessages();
    await loadConversations();
    showSources(citations, degraded);
  }

  // The turn's request to search the uploaded files, once there are any.
  function retrieval() {
    return state.store ? { llmmesh_retrieval: { vector_store_ids: [state.store] } } : {};
  }

  // Under the reply just streamed: the files its context cited, by marker.
  function showSources(citations, degraded) {
    const replies = document.querySelectorAll("#messages .message.assistant");
    const last = replies[replies.length - 1];
    if (!last || (!citations.length && !degraded)) return;
    const names = citations.map((c) => `${c.marker} ${c.filename}`);
    const text = degraded
      ? "Sources: your files could not be searched for this reply"
      : "Sources: " + names.join(", ");
    last.insertBefore(el("div", { class: "sources" }, text), last.querySelector(".actions"));
  }

  async function send() {
    const text = $("prompt").value;
    if (!text.trim() || state.busy) return;
    if (!state.conversation) {
      state.conversation = await call("POST", "/v1/conversations", { json: { title: text.slice(0, 60) } });
      history.replaceState(null, "", `#c=${encodeURIComponent(state.conversation.id)}`);
      $("title").textContent = state.conversation.title || state.conversation.id;
      await loadConversations();
    }
    const body = { content: text };
    let before = state.messages.length;
    if (state.editing) {
      body.edit_id = state.editing;
      before = state.messages.findIndex((m) => m.id === state.editing);
    } else if (state.messages.length) {
      body.parent_id = state.messages[state.messages.length - 1].id;
    }
    $("prompt").value = "";
    cancelEdit();
    await streamTurn(conversationPath("/messages"), body, before < 0 ? 0 : before, text);
  }

  async function regenerate(message) {
    if (state.busy) return;
    const at = state.messages.findIndex((m) => m.id === message.id);
    const path = conversationPath(`/messages/${encodeURIComponent(message.id)}/regenerate`);
    await streamTurn(path, {}, at < 0 ? state.messages.length : at, null);
  }

  // ---- files

  // The key's vector store of uploaded files, if it has one.
  async function findStore() {
    const stores = await listAll("/v1/vector_stores");
    const found = stores.find((s) => s.name === STORE_NAME);
    return found ? found.id : null;
  }

  async function upload() {
    const input = $("file");
    if (!input.files || !input.files.length) throw new Error("choose a file to upload first");
    const form = new FormData();
    form.append("purpose", "assistants");
    form.append("file", input.files[0]);
    $("upload-status").textContent = "uploading...";
    try {
      const file = await call("POST", "/v1/files", { form });
      if (!state.store) state.store = await findStore();
      if (!state.store) {
        state.store = (await call("POST", "/v1/vector_stores", { json: { name: STORE_NAME } })).id;
      }
      const path = `/v1/vector_stores/${encodeURIComponent(state.store)}/files`;
      await call("POST", path, { json: { file_id: file.id } });
      $("upload-status").textContent =
        `Uploaded ${file.filename} as ${file.id} (${file.bytes} bytes); replies now search your files`;
      $("upload-status").dataset.fileId = file.id;
      input.value = "";
    } catch (err) {
      $("upload-status").textContent = "";
      throw err;
    }
  }

  // ---- wiring

  document.addEventListener("DOMContentLoaded", () => {
    $("signin").addEventListener("submit", guard(() => signIn($("api-key").value.trim())));
    $("sign-out").addEventListener("click", () => signOut());
    $("new-chat").addEventListener("click", () => newChat());
    $("composer").addEventListener("submit", guard(() => send()));
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => state.controller && state.controller.abort());
    $("cancel-edit").addEventListener("click", () => cancelEdit());
    $("branches").addEventListener(
      "change",
      guard(async () => {
        state.leaf = $("branches").value;
        await loadMessages();
      })
    );
    $("upload").addEventListener("submit", guard(() => upload()));
    const saved = sessionStorage.getItem(KEY);
    if (saved) {
      guard(() => signIn(saved))().then(() => {
        if (!state.key) $("signin").hidden = false;
      });
    } else {
      $("signin").hidden = false;
    }
  });
})();
