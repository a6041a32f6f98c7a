import { describe, expect, it } from "vitest";
import { firstUsed, lineChart, linePath, niceTop } from "./charts";

describe("charts", () => {
  it("rounds the top of the scale up to 1, 2 or 5 times a power of ten", () => {
    expect([0, 0.03, 1, 3, 7, 12, 480].map(niceTop)).toEqual([1, 0.05, 1, 5, 10, 20, 500]);
  });

  it("draws a line over the box, breaking it where a value is missing", () => {
    expect(linePath([0, 10, null, 5, 5], 10, 400, 100)).toBe("M0.0 100.0 L100.0 0.0 M300.0 50.0 L400.0 50.0");
    // A lone value still shows, as a short stroke.
    expect(linePath([null, 2, null], 4, 200, 100)).toBe("M50.0 50.0 L150.0 50.0");
    expect(linePath([null, null, 4], 4, 200, 100)).toBe("M150.0 0.0 L200.0 0.0");
  });

  it("starts at the first interval with data, showing at least the last few", () => {
    expect(firstUsed([[0, 0, 0, 3, 0, 0, 0, 0], [null, null, 1, null, null, null, null, null]], 4)).toBe(2);
    expect(firstUsed([[0, 0, 0, 0, 0, 0, 1, 0]], 4)).toBe(4);
    expect(firstUsed([[], []], 4)).toBe(0);
  });

  it("names each line in its legend and its latest value in its label", () => {
    const chart = lineChart("Time to first token", "s", [0, 10], [{ label: "eu · small", values: [0.2, 0.05] }]);
    expect(chart.querySelector(".legend")?.textContent).toBe("eu · small");
    expect(chart.querySelector("svg")?.getAttribute("aria-label")).toBe("Time to first token: eu · small 50 ms");
    expect(chart.querySelector("path")?.getAttribute("data-points")).toBe("2");
    expect(chart.querySelector("[style]")).toBeNull();
  });
});
