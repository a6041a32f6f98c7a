// The operator page: the mesh's regions, their pods and queues, charts of
// the edge's last hour, the tenants it served, and a tenant's usage, from
// the edge's operator API (/ops/api/*); a tenant's API keys where the edge
// holds an admin identity.
import { byId, call, clearError, el, showError } from "./api";
import { firstUsed, type Line, lineChart } from "./charts";

interface RegionRow {
  region: string;
  zone: string;
  directory_health: string;
  queue_depth: number;
  capacity: number;
  models: string[];
  engine_pods: number;
  healthy_engine_pods: number;
  heartbeat_age_s: number | null;
  live: {
    reachable: boolean;
    health: string;
    error: string;
    engine_pods: number;
    healthy_engine_pods: number;
    models: string[];
  };
}

interface Usage {
  tenant_id: string;
  period: string;
  requests: number;
  input_tokens: number;
  output_tokens: number;
  cost_usd: string;
  models: Record<string, number>;
}

interface Series {
  region: string;
  model: string;
  requests: number[];
  errors: Record<string, number[]>;
  output_tokens_per_s: number[];
  ttft_p50_s: (number | null)[];
  ttft_p90_s: (number | null)[];
  itl_p50_s: (number | null)[];
}

interface RegionLoad {
  region: string;
  queue_depth: (number | null)[];
  healthy_engine_pods: (number | null)[];
}

interface TimeSeries {
  timestamps: number[];
  series: Series[];
  errors: Record<string, number[]>;
  regions: RegionLoad[];
  tenants: string[];
}

const KEY = "llmmesh.opsKey";
const REFRESH_MS = 5000;
const CHARTS_MS = 10_000;
const TENANTS_MS = 60_000;
const MAX_TENANTS = 20;
/** The charts show at least the last 10 minutes, and from the first interval with data. */
const LEAST_POINTS = 60;
let key: string | null = null;
let timers: ReturnType<typeof setInterval>[] = [];
let tenantsShown = "";

const sum = (values: number[]): number => values.reduce((a, b) => a + b, 0);

/** Per-code counts of every series' turn errors, added up interval by interval. */
function turnErrors(series: Series[], length: number): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  for (const s of series) {
    for (const [code, counts] of Object.entries(s.errors)) {
      const row = (out[code] ??= new Array<number>(length).fill(0));
      counts.forEach((n, i) => (row[i] += n));
    }
  }
  return out;
}

/** ``t`` from its first interval with data (see firstUsed). */
function trimmed(t: TimeSeries): TimeSeries {
  const lists = [
    ...t.series.flatMap((s) => [s.requests, ...Object.values(s.errors)]),
    ...Object.values(t.errors),
    ...t.regions.map((r) => r.healthy_engine_pods),
  ];
  const from = firstUsed(lists, LEAST_POINTS);
  const cut = <T>(values: T[]): T[] => values.slice(from);
  const byCode = (counts: Record<string, number[]>): Record<string, number[]> =>
    Object.fromEntries(Object.entries(counts).map(([code, values]) => [code, cut(values)]));
  return {
    timestamps: cut(t.timestamps),
    series: t.series.map((s) => ({
      ...s,
      requests: cut(s.requests),
      errors: byCode(s.errors),
      output_tokens_per_s: cut(s.output_tokens_per_s),
      ttft_p50_s: cut(s.ttft_p50_s),
      ttft_p90_s: cut(s.ttft_p90_s),
      itl_p50_s: cut(s.itl_p50_s),
    })),
    errors: byCode(t.errors),
    regions: t.regions.map((r) => ({ ...r, queue_depth: cut(r.queue_depth), healthy_engine_pods: cut(r.healthy_engine_pods) })),
    tenants: t.tenants,
  };
}

async function refreshCharts(): Promise<void> {
  if (!key) return;
  const t = trimmed(await call<TimeSeries>(key, "GET", "/ops/api/timeseries?window=3600"));
  const name = (s: Series): string => `${s.region} · ${s.model}`;
  const failed = turnErrors(t.series, t.timestamps.length);
  const errors: Line[] = [
    ...Object.entries(t.errors).map(([code, values]) => ({ label: code, values })),
    ...Object.entries(failed).map(([code, values]) => ({ label: `${code} (mid-turn)`, values })),
  ];
  byId("charts").replaceChildren(
    lineChart("Turns per 10 s", "", t.timestamps, t.series.map((s) => ({ label: name(s), values: s.requests }))),
    lineChart(
      "Output tokens/s",
      "",
      t.timestamps,
      t.series.map((s) => ({ label: name(s), values: s.output_tokens_per_s })),
    ),
    lineChart(
      "Time to first token",
      "s",
      t.timestamps,
      t.series.flatMap((s) => [
        { label: `${name(s)} p50`, values: s.ttft_p50_s },
        { label: `${name(s)} p90`, values: s.ttft_p90_s },
      ]),
    ),
    lineChart("Inter-token latency p50", "s", t.timestamps, t.series.map((s) => ({ label: name(s), values: s.itl_p50_s }))),
    lineChart("Refusals and errors per 10 s", "", t.timestamps, errors),
    lineChart("Region queue depth", "", t.timestamps, t.regions.map((r) => ({ label: r.region, values: r.queue_depth }))),
    lineChart(
      "Healthy engine pods",
      "",
      t.timestamps,
      t.regions.map((r) => ({ label: r.region, values: r.healthy_engine_pods })),
    ),
  );
  const reasons = [
    ...Object.entries(t.errors).map(([code, v]) => [code, "answered", sum(v)] as const),
    ...Object.entries(failed).map(([code, v]) => [code, "mid-turn", sum(v)] as const),
  ]
    .filter(([, , n]) => n > 0)
    .sort((a, b) => b[2] - a[2])
    .map(([code, where, n]) => {
      const tr = el("tr", { "data-code": code });
      tr.append(el("td", {}, code), el("td", {}, where), el("td", {}, n));
      return tr;
    });
  if (!reasons.length) {
    const tr = el("tr");
    tr.append(el("td", { colspan: "3" }, "none in the last hour"));
    reasons.push(tr);
  }
  document.querySelector("#reasons tbody")?.replaceChildren(...reasons);
  const tenants = t.tenants.slice(0, MAX_TENANTS).join(",");
  if (tenants !== tenantsShown) await refreshTenants(t.tenants.slice(0, MAX_TENANTS));
}

async function refreshTenants(tenants: string[]): Promise<void> {
  if (!key) return;
  const opsKey = key;
  const usages = await Promise.all(
    tenants.map((id) => call<Usage>(opsKey, "GET", `/ops/api/usage?${new URLSearchParams({ tenant_id: id })}`)),
  );
  const rows = usages.map((u) => {
    const tr = el("tr", { "data-tenant": u.tenant_id });
    for (const cell of [u.tenant_id, u.requests, u.input_tokens, u.output_tokens, u.cost_usd]) {
      tr.append(el("td", {}, cell));
    }
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    tr.append(el("td", { colspan: "5" }, "none in the last hour"));
    rows.push(tr);
  }
  document.querySelector("#tenants tbody")?.replaceChildren(...rows);
  tenantsShown = tenants.join(",");
}

async function refresh(): Promise<void> {
  if (!key) return;
  const body = await call<{ global_plane: boolean; data: RegionRow[] }>(key, "GET", "/ops/api/regions");
  byId("global-plane").textContent = body.global_plane ? "(global plane serving)" : "(global plane DOWN)";
  const rows = body.data.map((r) => {
    const live = r.live.reachable ? r.live.health : `unreachable (${r.live.error})`;
    const pods = r.live.reachable
      ? `${r.live.healthy_engine_pods} / ${r.live.engine_pods}`
      : `${r.healthy_engine_pods} / ${r.engine_pods} (reported)`;
    const age = r.heartbeat_age_s === null ? "never" : `${r.heartbeat_age_s.toFixed(1)} s`;
    const tr = el("tr", { "data-region": r.region, "data-zone": r.zone });
    const models = (r.live.reachable ? r.live.models : r.models).join(", ");
    for (const cell of [r.region, r.zone, r.directory_health, live, pods, r.queue_depth, r.capacity, models, age]) {
      tr.append(el("td", {}, cell));
    }
    return tr;
  });
  document.querySelector("#regions tbody")?.replaceChildren(...rows);
  byId("refreshed").textContent = `Last refresh ${new Date().toLocaleTimeString()}`;
}

async function showUsage(): Promise<void> {
  if (!key) return;
  const params = new URLSearchParams({ tenant_id: byId<HTMLInputElement>("tenant-id").value.trim() });
  const period = byId<HTMLInputElement>("period").value.trim();
  if (period) params.set("period", period);
  const u = await call<Usage>(key, "GET", `/ops/api/usage?${params}`);
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
    tr.append(el("th", { scope: "row" }, name), el("td", {}, value));
    return tr;
  });
  document.querySelector("#usage tbody")?.replaceChildren(...rows);
  byId("usage").hidden = false;
}

interface ApiKeyRow {
  id: string;
  prefix: string;
  created: number | null;
  revoked: number | null;
}

let keysTenant = "";

function when(seconds: number | null): string {
  return seconds === null ? "" : new Date(seconds * 1000).toLocaleString();
}

async function listKeys(tenant: string): Promise<void> {
  if (!key) return;
  const path = `/ops/api/tenants/${encodeURIComponent(tenant)}/keys`;
  const body = await call<{ data: ApiKeyRow[] }>(key, "GET", path);
  keysTenant = tenant;
  const rows = body.data.map((k) => {
    const tr = el("tr", { "data-key": k.id });
    const state = k.revoked === null ? "active" : `revoked ${when(k.revoked)}`;
    for (const cell of [k.id, `${k.prefix}…`, when(k.created), state]) tr.append(el("td", {}, cell));
    const action = el("td");
    if (k.revoked === null) {
      const revoke = el("button", { type: "button", class: "revoke", "aria-label": `Revoke key ${k.id}` }, "Revoke");
      revoke.addEventListener("click", guard(() => revokeKey(k.id)));
      action.append(revoke);
    }
    tr.append(action);
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    tr.append(el("td", { colspan: "5" }, "no keys"));
    rows.push(tr);
  }
  document.querySelector("#keys tbody")?.replaceChildren(...rows);
  byId("keys-panel").hidden = false;
}

async function createKey(): Promise<void> {
  if (!key || !keysTenant) return;
  const path = `/ops/api/tenants/${encodeURIComponent(keysTenant)}/keys`;
  const created = await call<{ key: ApiKeyRow; secret: string }>(key, "POST", path);
  byId("new-secret").textContent = created.secret;
  byId("new-key").hidden = false;
  await listKeys(keysTenant);
}

async function revokeKey(id: string): Promise<void> {
  if (!key || !window.confirm(`Revoke key ${id}? Clients using it are refused from now on.`)) return;
  await call<ApiKeyRow>(key, "POST", `/ops/api/keys/${encodeURIComponent(id)}/revoke`);
  await listKeys(keysTenant);
}

function pickTenant(event: Event): void {
  const row = (event.target as HTMLElement).closest<HTMLElement>("tr[data-tenant]");
  const tenant = row?.dataset.tenant;
  if (!tenant) return;
  byId<HTMLInputElement>("keys-tenant").value = tenant;
  void guard(() => listKeys(tenant))();
}

async function signIn(candidate: string): Promise<void> {
  key = candidate;
  try {
    await refresh();
    await refreshCharts();
  } catch (err) {
    key = null;
    sessionStorage.removeItem(KEY);
    throw err;
  }
  sessionStorage.setItem(KEY, candidate);
  byId("signin").hidden = true;
  byId("dashboard").hidden = false;
  byId("sign-out").hidden = false;
  timers = [
    setInterval(() => refresh().then(clearError, showError), REFRESH_MS),
    setInterval(() => refreshCharts().catch(showError), CHARTS_MS),
    // Billing lags the turns: the tenants' usage is read again now and then.
    setInterval(() => {
      tenantsShown = "";
    }, TENANTS_MS),
  ];
}

function signOut(): void {
  for (const timer of timers) clearInterval(timer);
  timers = [];
  sessionStorage.removeItem(KEY);
  key = null;
  byId("dashboard").hidden = true;
  byId("sign-out").hidden = true;
  byId("new-key").hidden = true;
  byId("new-secret").textContent = "";
  byId("signin").hidden = false;
}

function guard(action: () => Promise<void>): (event?: Event) => Promise<void> {
  return (event?: Event) => {
    event?.preventDefault();
    clearError();
    return action().catch(showError);
  };
}

byId("signin").addEventListener("submit", guard(() => signIn(byId<HTMLInputElement>("ops-key").value.trim())));
byId("usage-form").addEventListener("submit", guard(() => showUsage()));
byId("sign-out").addEventListener("click", () => signOut());
byId("keys-form").addEventListener(
  "submit",
  guard(() => {
    byId("new-key").hidden = true;
    byId("new-secret").textContent = "";
    return listKeys(byId<HTMLInputElement>("keys-tenant").value.trim());
  }),
);
byId("create-key").addEventListener("click", guard(() => createKey()));
byId("copy-secret").addEventListener(
  "click",
  guard(() => navigator.clipboard.writeText(byId("new-secret").textContent ?? "")),
);
byId("tenants").addEventListener("click", pickTenant);
const saved = sessionStorage.getItem(KEY);
if (saved) {
  void guard(() => signIn(saved))().then(() => {
    if (!key) byId("signin").hidden = false;
  });
} else {
  byId("signin").hidden = false;
}
