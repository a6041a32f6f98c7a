// A reply's markdown as sanitised HTML: markdown-it with raw HTML off,
// highlight.js for fenced code, DOMPurify over the result; code blocks get a
// copy button. Links open in a new tab without a referrer.
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import MarkdownIt from "markdown-it";

const LANGUAGES = { bash, cpp, css, diff, go, java, javascript, json, python, rust, sql, typescript, xml, yaml };
for (const [name, language] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, language);

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const md: MarkdownIt = new MarkdownIt({
  html: false,
  linkify: true,
  breaks: false,
  highlight(code: string, lang: string): string {
    const language = lang && hljs.getLanguage(lang) ? lang : null;
    const body = language ? hljs.highlight(code, { language, ignoreIllegals: true }).value : escapeHtml(code);
    const label = escapeHtml(lang || "text");
    return `<pre class="code" data-lang="${label}"><code class="hljs${language ? ` language-${label}` : ""}">${body}</code></pre>`;
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** `text` (markdown) as HTML that is safe to set as innerHTML. */
export function renderMarkdown(text: string): string {
  return DOMPurify.sanitize(md.render(text), {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style"],
    ADD_ATTR: ["target"],
  });
}

/** Sets `text`, rendered, as the content of `into`, with a copy button on each code block. */
export function showMarkdown(into: HTMLElement, text: string): void {
  into.innerHTML = renderMarkdown(text);
  for (const pre of into.querySelectorAll<HTMLPreElement>("pre")) {
    const code = pre.querySelector("code");
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const lang = document.createElement("span");
    lang.className = "code-lang";
    lang.textContent = pre.dataset.lang || "text";
    const button = copyLabel("copy-code", `${lang.textContent} code`);
    button.addEventListener("click", () => void copyText(code ? code.textContent || "" : "", button));
    bar.append(lang, button);
    pre.before(bar);
    const block = document.createElement("div");
    block.className = "code-block";
    bar.before(block);
    block.append(bar, pre);
  }
}

/** A "Copy" button whose name says what it copies (the rest of the name only to a screen reader). */
export function copyLabel(className: string, what: string): HTMLButtonElement {
  const button = document.createElement("button");
  button.type = "button";
  button.className = className;
  const label = document.createElement("span");
  label.className = "label";
  label.textContent = "Copy";
  const rest = document.createElement("span");
  rest.className = "visually-hidden";
  rest.textContent = ` ${what}`;
  button.append(label, rest);
  return button;
}

/** Copies `text` to the clipboard and says so on `button` for a moment. */
export async function copyText(text: string, button: HTMLButtonElement): Promise<void> {
  const shown = button.querySelector<HTMLElement>(".label") || button;
  const label = shown.textContent;
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch {
    // No clipboard API here (an insecure origin, say): the selection's copy command.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    copied = document.execCommand("copy");
    area.remove();
  }
  shown.textContent = copied ? "Copied" : "Copy failed";
  button.dataset.copied = copied ? "true" : "false";
  setTimeout(() => {
    shown.textContent = label;
  }, 1500);
}
