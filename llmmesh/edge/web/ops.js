"use strict";
// The operator page: the mesh's regions, their pods and queues, and a
// tenant's usage, from the edge's operator API (/ops/api/*).
(function () {
  const api = window.LLMMesh;
  const el = api.el;
  const KEY = "llmmesh.opsKey";
  const REFRESH_MS = 5000;
  const $ = (id) => document.getElementById(id);
  let key = null;
  let timer = null;

  function showError(err) {
    $("error").textContent = err instanceof Error ? err.message : String(err);
    $("error").hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
  }

  async function refresh() {
    const body = await api.call(key, "GET", "/ops/api/regions");
    $("global-plane").textContent = body.global_plane ? "(global plane serving)" : "(global plane DOWN)";
    const rows = body.data.map((r) => {
      const live = r.live.reachable ? r.live.health : `unreachable (${r.live.error})`;
      const pods = r.live.reachable
        ? `${r.live.healthy_engine_pods} / ${r.live.engine_pods}`
        : `${r.healthy_engine_pods} / ${r.engine_pods} (reported)`;
      const age = r.heartbeat_age_s === null ? "never" : `${r.heartbeat_age_s.toFixed(1)} s`;
      const tr = el("tr", { "data-region": r.region, "data-zone": r.zone });
      for (const cell of [
        r.region,
        r.zone,
        r.directory_health,
        live,
        pods,
        r.queue_depth,
        r.capacity,
        (r.live.reachable ? r.live.models : r.models).join(", "),
        age,
      ]) {
        tr.append(el("td", {}, cell));
      }
      return tr;
    });
    document.querySelector("#regions tbody").replaceChildren(...rows);
    $("refreshed").textContent = "Last refresh " + new Date().toLocaleTimeString();
  }

  async function showUsage() {
    const params = new URLSearchParams({ tenant_id: $("tenant-id").value.trim() });
    if ($("period").value.trim()) params.set("period", $("period").value.trim());
    const u = await api.call(key, "GET", "/ops/api/usage?" + params.toString());
    const rows = [
      ["tenant", u.tenant_id],
      ["period", u.period],
      ["requests", u.requests],
      ["input tokens", u.input_tokens],
      ["output tokens", u.output_tokens],
      ["cost (USD)", u.cost_usd],
      ...Object.entries(u.models).map(([model, tokens]) => [`output tokens of ${model}`, tokens]),
    ].map(([name, value]) => {
      const tr = el("tr");
      tr.append(el("th", {}, name), el("td", {}, value));
      return tr;
    });
    document.querySelector("#usage tbody").replaceChildren(...rows);
    $("usage").hidden = false;
  }

  async function signIn(candidate) {
    key = candidate;
    try {
      await refresh();
    } catch (err) {
      key = null;
      sessionStorage.removeItem(KEY);
      throw err;
    }
    sessionStorage.setItem(KEY, candidate);
    $("signin").hidden = true;
    $("dashboard").hidden = false;
    $("sign-out").hidden = false;
    timer = setInterval(() => refresh().then(clearError, showError), REFRESH_MS);
  }

  function signOut() {
    if (timer) clearInterval(timer);
    sessionStorage.removeItem(KEY);
    key = null;
    $("dashboard").hidden = true;
    $("sign-out").hidden = true;
    $("signin").hidden = false;
  }

  function guard(action) {
    return (event) => {
      if (event) event.preventDefault();
      clearError();
      return action().catch(showError);
    };
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("signin").addEventListener("submit", guard(() => signIn($("ops-key").value.trim())));
    $("usage-form").addEventListener("submit", guard(() => showUsage()));
    $("sign-out").addEventListener("click", () => signOut());
    const saved = sessionStorage.getItem(KEY);
    if (saved) {
      guard(() => signIn(saved))().then(() => {
        if (!key) $("signin").hidden = false;
      });
    } else {
      $("signin").hidden = false;
    }
  });
})();
