// Builds the edge's two pages into the Python package (llmmesh/edge/web),
// which the edge serves at /chat and /ops and their files at /web/<name>.
// The file names are fixed (no hashes): edge/web_routes.py lists them.
import { resolve } from "node:path";
import { defineConfig } from "vitest/config";

const here = import.meta.dirname;

export default defineConfig({
  base: "/web/",
  build: {
    outDir: resolve(here, "../llmmesh/edge/web"),
    emptyOutDir: true,
    assetsDir: "",
    target: "es2022",
    // Every browser the pages support loads modules natively.
    modulePreload: { polyfill: false },
    rollupOptions: {
      input: { chat: resolve(here, "chat.html"), ops: resolve(here, "ops.html") },
      output: {
        entryFileNames: "[name].js",
        chunkFileNames: "[name].js",
        assetFileNames: "[name][extname]",
        // What both pages share is one file, named for what it is.
        manualChunks: (id) => (id.includes("/src/api") ? "api" : undefined),
      },
    },
  },
  test: { environment: "jsdom", include: ["src/**/*.test.ts"] },
});
