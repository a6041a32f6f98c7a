// Line charts drawn as SVG, styled only by classes (the page's policy
// allows no inline style): one chart per measure, one line per series, a
// gap where a series has no value. The plot scales to its box's width.
import { el } from "./api";

export interface Line {
  label: string;
  values: (number | null)[];
}

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 140;
/** Line colours cycle through this many classes (.line-0 ... in style.css). */
export const COLOURS = 6;

/** The smallest "nice" top (1, 2 or 5 times a power of ten) at or above ``max``. */
export function niceTop(max: number): number {
  if (!(max > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}

/** Where charts of ``lists`` start: their first interval with a value
 *  (not null, not 0), but showing at least the last ``least`` intervals. */
export function firstUsed(lists: (number | null)[][], least: number): number {
  const length = Math.max(0, ...lists.map((l) => l.length));
  const used = lists.map((l) => l.findIndex((v) => v !== null && v !== 0)).filter((i) => i >= 0);
  return Math.max(0, Math.min(length - least, ...used));
}

/** The SVG path of ``values`` over a ``width`` x ``height`` box scaled to ``top``;
 *  a null breaks the line, a lone value is a short stroke. */
export function linePath(values: (number | null)[], top: number, width = WIDTH, height = HEIGHT): string {
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  const parts: string[] = [];
  let open = false;
  values.forEach((value, i) => {
    if (value === null || !Number.isFinite(value)) {
      open = false;
      return;
    }
    const x = i * step;
    const y = (height - (Math.min(value, top) / top) * height).toFixed(1);
    if (!open && (values[i + 1] === null || values[i + 1] === undefined)) {
      // A lone value: a short stroke around it, inside the box.
      const half = Math.max(step / 2, 4);
      parts.push(`M${Math.max(0, x - half).toFixed(1)} ${y} L${Math.min(width, x + half).toFixed(1)} ${y}`);
      return;
    }
    parts.push(`${open ? "L" : "M"}${x.toFixed(1)} ${y}`);
    open = true;
  });
  return parts.join(" ");
}

function format(value: number, unit: string): string {
  if (unit === "s") return value >= 1 ? `${value.toFixed(1)} s` : `${Math.round(value * 1000)} ms`;
  return `${Number.isInteger(value) ? value : value.toFixed(1)}${unit ? ` ${unit}` : ""}`;
}

/** A chart of ``lines`` over ``timestamps`` (Unix seconds), its values in ``unit``. */
export function lineChart(title: string, unit: string, timestamps: number[], lines: Line[]): HTMLElement {
  const figure = el("figure", { class: "chart", "data-chart": title });
  figure.append(el("figcaption", {}, title));
  const all = lines.flatMap((l) => l.values.filter((v): v is number => v !== null));
  // Headroom above the highest value, so a steady line does not hide in the frame.
  const top = niceTop(Math.max(0, ...all) * 1.1);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const latest = lines.map((l) => `${l.label} ${format([...l.values].reverse().find((v) => v !== null) ?? 0, unit)}`);
  svg.setAttribute("aria-label", `${title}: ${latest.join("; ") || "no data"}`);
  for (const y of [0, HEIGHT / 2]) {
    const grid = document.createElementNS(SVG, "line");
    for (const [k, v] of Object.entries({ x1: 0, x2: WIDTH, y1: y + 0.5, y2: y + 0.5 })) grid.setAttribute(k, String(v));
    grid.setAttribute("class", "grid");
    svg.append(grid);
  }
  lines.forEach((line, i) => {
    const path = document.createElementNS(SVG, "path");
    path.setAttribute("d", linePath(line.values, top));
    path.setAttribute("class", `line line-${i % COLOURS}`);
    path.setAttribute("data-points", String(line.values.filter((v) => v !== null).length));
    svg.append(path);
  });
  const plot = el("div", { class: "plot" });
  plot.append(el("span", { class: "axis top" }, format(top, unit)), svg);
  const span = timestamps.length ? Math.round((timestamps[timestamps.length - 1] - timestamps[0]) / 60) : 0;
  plot.append(el("span", { class: "axis from" }, `${span} min ago`), el("span", { class: "axis to" }, "now"));
  figure.append(plot);
  const legend = el("ul", { class: "legend" });
  lines.forEach((line, i) => {
    const item = el("li", { class: `key-${i % COLOURS}` });
    item.append(el("span", { class: "swatch", "aria-hidden": "true" }), el("span", {}, line.label));
    legend.append(item);
  });
  if (!lines.length) legend.append(el("li", { class: "empty" }, "no data yet"));
  figure.append(legend);
  return figure;
}
