import { describe, expect, it } from "vitest";
import { renderMarkdown, showMarkdown } from "./markdown";

describe("renderMarkdown", () => {
  it("highlights a fenced code block by its language", () => {
    const html = renderMarkdown("Here:\n\n```python\ndef f(x):\n    return x + 1\n```\n");
    const box = document.createElement("div");
    box.innerHTML = html;
    const code = box.querySelector("pre.code code.language-python");
    expect(code?.textContent).toBe("def f(x):\n    return x + 1\n");
    expect(code?.querySelector(".hljs-keyword")?.textContent).toBe("def");
  });

  it("shows an unknown language's code as escaped text", () => {
    const box = document.createElement("div");
    box.innerHTML = renderMarkdown("```nosuchlang\n<b>x</b>\n```");
    expect(box.querySelector("pre code")?.textContent).toBe("<b>x</b>\n");
    expect(box.querySelector("b")).toBeNull();
  });

  it("keeps markup in the text as text and drops script URLs", () => {
    const html = renderMarkdown(
      '<img src=x onerror="alert(1)"> <script>alert(2)</script> [link](javascript:alert(3)) [ok](https://example.org)',
    );
    const box = document.createElement("div");
    box.innerHTML = html;
    expect(box.querySelector("img, script")).toBeNull();
    expect(box.querySelector('a[href^="javascript"]')).toBeNull();
    const links = box.querySelectorAll("a");
    expect(links).toHaveLength(1);
    expect(links[0].getAttribute("href")).toBe("https://example.org");
    expect(links[0].getAttribute("rel")).toBe("noopener noreferrer");
    expect(box.textContent).toContain("<script>alert(2)</script>");
  });

  it("renders emphasis, lists and tables", () => {
    const box = document.createElement("div");
    box.innerHTML = renderMarkdown("**bold** _it_\n\n- a\n- b\n\n| h |\n|---|\n| c |\n");
    expect(box.querySelector("strong")?.textContent).toBe("bold");
    expect(box.querySelectorAll("li")).toHaveLength(2);
    expect(box.querySelector("td")?.textContent).toBe("c");
  });
});

describe("showMarkdown", () => {
  it("puts a labelled copy button on each code block", async () => {
    const box = document.createElement("div");
    showMarkdown(box, "```js\nlet a = 1;\n```\n\n```\nplain\n```");
    const buttons = box.querySelectorAll<HTMLButtonElement>(".code-block button.copy-code");
    expect(buttons).toHaveLength(2);
    expect(buttons[0].textContent).toBe("Copy js code");
    expect(buttons[1].textContent).toBe("Copy text code");
    let copied = "";
    Object.defineProperty(navigator, "clipboard", {
      value: { writeText: async (text: string) => void (copied = text) },
      configurable: true,
    });
    buttons[0].click();
    await new Promise((resolve) => setTimeout(resolve, 0));
    expect(copied).toBe("let a = 1;\n");
    expect(buttons[0].querySelector(".label")?.textContent).toBe("Copied");
  });
});
