"""The web chat page and the operator page, driven in a real headless
Chromium (Debian's chromium and chromedriver, through Selenium) against a
real ``llmmesh up --engine sim``, at a laptop's size (1366x900) and a
phone's (390x844), light and dark: a prompt's reply streams into the page
with the model and the region's reason for it, Stop cancels a reply, a
refused turn offers Retry, a reply's code block is highlighted and copies,
a regenerated reply and an edited message make branches the page switches
between, a branch goes on where it was left, the conversation is found
again after a reload, a file uploads and a reply cites it, a conversation
is deleted once confirmed, axe-core finds no serious or critical
accessibility problem, and the operator page lists the mesh's regions and
charts the edge's last hour (light and dark, laptop and phone).
Screenshots of each step are kept under ``$LLMMESH_ARTIFACTS/web_chat``
(else the test's temporary directory). The page's modules have their own
tests (``npm test`` in ``web/``), run here too."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    ElementNotInteractableException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e.conftest import RunningMesh, start_up, stop_up

OPS_KEY = "ops-key-web-e2e"
DEV_KEY = "sk-llmmesh-web"
# Slow enough decode steps that a reply takes many separate renders.
INTER_TOKEN_S = "0.02"
WAIT_S = 60.0
PROMPT = "Tell me how the mesh keeps a stream alive"

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
LAPTOP = (1366, 900)
PHONE = (390, 844)
CODE_REPLY = "A loop:\n\n```python\nfor i in range(3):\n    print(i)\n```\n\nThat prints three lines."


@pytest.fixture(scope="module")
def web_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A mesh of its own: its edge has an operator key, its pods decode slowly."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMMESH_OPS_KEY", OPS_KEY)
        patch.setenv("LLMMESH_SIM_INTER_TOKEN_S", INTER_TOKEN_S)
        running = start_up(
            tmp_path_factory.mktemp("llmmesh-web"),
            "--engine",
            "sim",
            "--edge-port",
            "0",
            "--dev-key",
            DEV_KEY,
        )
    yield running
    if running.process.poll() is None:
        status, out = stop_up(running)
        assert status == 0, out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("LLMMESH_ARTIFACTS")
    where = Path(root) / "web_chat" if root else tmp_path_factory.mktemp("web-chat-artifacts")
    where.mkdir(parents=True, exist_ok=True)
    print(f"web page screenshots: {where}")
    return where


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium is missing: bash scripts/setup.sh installs Debian's chromium"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    chrome.set_page_load_timeout(WAIT_S)
    chrome.set_script_timeout(WAIT_S)
    # The copy buttons write to the clipboard; the test reads it back.
    chrome.execute_cdp_cmd(
        "Browser.grantPermissions", {"permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}
    )
    yield chrome
    chrome.quit()


class Page:
    """The browser on one page, with bounded waits that leave a screenshot
    and the console behind when they time out."""

    def __init__(self, chrome: webdriver.Chrome, artifacts: Path, prefix: str) -> None:
        self.chrome = chrome
        self.artifacts = artifacts
        self.prefix = prefix
        self.shots = 0

    def shot(self, name: str) -> Path:
        self.shots += 1
        path = self.artifacts / f"{self.prefix}-{self.shots:02d}-{name}.png"
        assert self.chrome.save_screenshot(str(path)), path
        return path

    def until(self, condition: Callable[[webdriver.Chrome], T], what: str) -> T:
        """``condition``'s first truthy answer, within WAIT_S."""
        try:
            result = WebDriverWait(
                self.chrome, WAIT_S, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
            ).until(condition)
        except TimeoutException:
            shot = self.shot("timeout")
            console = "\n".join(str(e["message"]) for e in self.console())
            raise AssertionError(f"timed out waiting for {what} (screenshot {shot})\n{console}") from None
        return result

    def find(self, css: str) -> WebElement:
        return self.chrome.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.chrome.find_elements(By.CSS_SELECTOR, css)

    def visible(self, element_id: str) -> WebElement:
        self.until(lambda c: c.find_element(By.ID, element_id).is_displayed(), f"#{element_id} shown")
        return self.chrome.find_element(By.ID, element_id)

    def click(self, element_id: str) -> None:
        """Click ``#element_id`` once it is shown and takes the click: a button
        that has just appeared can sit, for a frame or two, where the layout
        put it before the thread reflowed (a click there lands on whatever
        covers it), or have no size yet on a busy machine (the browser refuses
        a click on it). The first refused click leaves a screenshot."""
        covered = False

        def clicked(chrome: webdriver.Chrome) -> bool:
            element = chrome.find_element(By.ID, element_id)
            if not element.is_displayed():
                return False
            try:
                element.click()
            except (ElementClickInterceptedException, ElementNotInteractableException):
                nonlocal covered
                if not covered:
                    self.shot(f"{element_id}-covered")
                covered = True
                return False
            return True

        self.until(clicked, f"#{element_id} shown and taking the click")

    def messages(self) -> list[tuple[str, str, str]]:
        """The thread as shown: (role, stored id, text) of each message, read
        in one go (the page redraws the thread as a turn goes on)."""
        rows: list[list[str]] = self.chrome.execute_script(_THREAD)
        return [(role, message_id, text) for role, message_id, text in rows]

    def settled(self, count: int | None = None) -> list[tuple[str, str, str]]:
        """The thread once no reply streams and every message shown is the
        stored one (and, given ``count``, that many are shown)."""

        def done(chrome: webdriver.Chrome) -> bool:
            shown = self.messages()
            return (
                bool(shown)
                and (count is None or len(shown) == count)
                and not self.all(".message.streaming")
                and not self.find("#send").get_attribute("disabled")
                and all(message_id for _, message_id, _ in shown)
            )

        self.until(done, f"the stored thread{'' if count is None else f' of {count} messages'}")
        return self.messages()

    def error(self) -> str:
        box = self.find("#error")
        return box.text if box.is_displayed() else ""

    def console(self) -> list[dict[str, str]]:
        """The browser console's entries since the last read."""
        entries: list[dict[str, str]] = self.chrome.get_log("browser")  # type: ignore[no-untyped-call]
        return entries

    def csp_violations(self) -> list[str]:
        return [str(e["message"]) for e in self.console() if "Content Security Policy" in e["message"]]

    def view(self, size: tuple[int, int], *, dark: bool = False) -> None:
        """Show the page at ``size`` (a phone's is a touch screen), light or dark."""
        width, height = size
        self.chrome.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 700},
        )
        scheme = {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}
        self.chrome.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [scheme]})

    def fits(self, width: int) -> None:
        """Nothing on the page, once laid out at this size, is wider than
        ``width`` (no sideways scrolling); names what is, if anything."""
        script = "return document.documentElement.scrollWidth"
        try:
            WebDriverWait(self.chrome, 3, poll_frequency=0.1).until(
                lambda c: c.execute_script(script) <= width
            )
        except TimeoutException:
            wide = self.chrome.execute_script(
                "return [...document.querySelectorAll('body *')]"
                ".filter(e => e.getBoundingClientRect().right > arguments[0])"
                ".slice(0, 8).map(e => e.tagName + '#' + e.id + '.' + e.className + ' '"
                " + Math.round(e.getBoundingClientRect().right))",
                width,
            )
            raise AssertionError(f"wider than {width} px: {wide}") from None

    def axe(self, what: str) -> None:
        """axe-core over the page as shown: no serious or critical violation."""
        if not self.chrome.execute_script("return !!window.axe"):
            source = (WEB / "node_modules" / "axe-core" / "axe.min.js").read_text()
            self.chrome.execute_script(source + "\nwindow.axe = axe;")
        found: list[dict[str, object]] = self.chrome.execute_async_script(_AXE)
        serious = [v for v in found if v["impact"] in ("serious", "critical")]
        assert not serious, f"axe-core on {what}:\n" + json.dumps(serious, indent=1)

    def clipboard(self) -> str:
        text: str = self.chrome.execute_async_script(
            "const done = arguments[0]; navigator.clipboard.readText().then(done, (e) => done('! ' + e));"
        )
        return text


_THREAD = """
return Array.from(document.querySelectorAll('#messages .message'),
  (m) => [m.dataset.role || '', m.dataset.id || '', m.querySelector('.content').textContent.trim()]);
"""

_AXE = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(
  (r) => done(r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 5)}))),
  (e) => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));
"""

# Records, in the page, the text of the reply being streamed at every DOM change.
_OBSERVE = """
window.__streamed = [];
new MutationObserver(() => {
  const node = document.querySelector('.message.streaming .content');
  if (node) window.__streamed.push(node.textContent.trim());
}).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
"""


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.sources: list[str] = []
        self.links: list[str] = []
        self.styles = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script":
            if named.get("src"):
                self.sources.append(str(named["src"]))
            else:
                self.inline.append(tag)
        if tag == "link" and named.get("href"):
            self.links.append(str(named["href"]))
        if tag == "style" or "style" in named or any(k.startswith("on") for k in named):
            self.styles += 1


def test_page_is_static_with_a_strict_policy(web_mesh: RunningMesh) -> None:
    for path in ("/chat", "/ops"):
        resp = httpx.get(web_mesh.edge_url + path, timeout=10)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        policy = resp.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "unsafe" not in policy
        parsed = _Scripts()
        parsed.feed(resp.text)
        assert not parsed.inline and not parsed.styles, resp.text
        assert parsed.sources, resp.text
        for src in parsed.sources + parsed.links:
            assert src.startswith("/web/"), src
            asset = httpx.get(web_mesh.edge_url + src, timeout=10)
            kind = "css" if src.endswith(".css") else "javascript"
            assert asset.status_code == 200 and kind in asset.headers["content-type"], src
    missing = httpx.get(web_mesh.edge_url + "/web/../edge/app.py", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_the_page_modules_pass_their_own_tests() -> None:
    """The markdown renderer (highlighting, sanitising, copy buttons) and the
    turn's stream (resume, stop, refusals), in node (vitest)."""
    npm = shutil.which("npm")
    assert npm and (WEB / "node_modules").is_dir(), "bash scripts/setup.sh installs node and web/node_modules"
    # Plain output whatever the environment (CI sets variables vitest colours its report by).
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    result = subprocess.run(
        [npm, "test", "--silent"], cwd=WEB, capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    assert re.search(r"Tests\s+\d+ passed", report), report


def test_chat_page_streams_branches_and_finds_the_conversation_again(
    web_mesh: RunningMesh, browser: webdriver.Chrome, artifacts: Path, tmp_path: Path
) -> None:
    page = Page(browser, artifacts, "chat")
    auth = {"Authorization": f"Bearer {DEV_KEY}"}
    page.view(LAPTOP)
    browser.get(web_mesh.edge_url + "/chat")

    # A wrong key is refused with the edge's error object, shown as such.
    page.visible("api-key").send_keys("sk-not-a-key")
    page.find("#sign-in").click()
    refusal = page.until(lambda c: page.error(), "the sign-in refusal")
    assert refusal.startswith("401") and "invalid_api_key" in refusal, refusal
    page.shot("wrong-key")
    key_box = page.find("#api-key")
    key_box.clear()
    key_box.send_keys(DEV_KEY)
    page.find("#sign-in").click()
    page.visible("app")
    # Signed in, the message box has the focus; the model picker offers auto and the mesh's
    # chat models, not its embedding model.
    page.until(lambda c: c.execute_script("return document.activeElement.id") == "prompt", "focus in the box")
    models = httpx.get(f"{web_mesh.edge_url}/v1/models", headers=auth, timeout=10).json()["data"]
    assert {m["kind"] for m in models} == {"chat", "embedding"}
    picker = Select(page.find("#model"))
    chat_models = [m["id"] for m in models if m["kind"] == "chat"]
    assert [o.get_attribute("value") for o in picker.options] == ["auto", *chat_models]
    assert picker.first_selected_option.text == "auto"

    # A prompt's reply streams (Shift+Enter is a new line, Enter sends): the page shows it growing.
    browser.execute_script(_OBSERVE)
    prompt = page.find("#prompt")
    prompt.send_keys("Tell me how the mesh", Keys.SHIFT, Keys.ENTER, Keys.SHIFT)
    assert prompt.get_attribute("value") == "Tell me how the mesh\n"
    prompt.send_keys(Keys.BACKSPACE, PROMPT.removeprefix("Tell me how the mesh"), Keys.ENTER)
    page.until(lambda c: page.all(".message.streaming"), "the reply to start streaming")
    page.shot("streaming")
    thread = page.settled()
    streamed: list[str] = browser.execute_script("return window.__streamed")
    grew = [t for i, t in enumerate(streamed) if t and (i == 0 or t != streamed[i - 1])]
    assert len(grew) >= 2, streamed
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(grew)), grew
    assert [role for role, _, _ in thread] == ["user", "assistant"], thread
    (_, question_id, question), (_, first_id, first_reply) = thread
    assert question == PROMPT and first_reply == grew[-1]
    conversation_id = re.sub(r"^#c=", "", browser.execute_script("return location.hash"))
    assert conversation_id.startswith("conv_"), conversation_id
    # The reply names its model and the region's reason for it (auto: the region chose).
    route = page.find(f'.message[data-id="{first_id}"] .route').text
    assert re.fullmatch(r"\S+ · route: (default|difficulty|budget|fallback)( \(.*\))?", route), route
    page.shot("streamed")

    # Regenerate with a model picked (the one that served): a second branch, shown at once, with the picker.
    chosen = route.split(" · ")[0]
    picker.select_by_value(chosen)
    page.find(f'.message[data-id="{first_id}"] .regenerate').click()
    page.until(lambda c: len(Select(page.find("#branches")).options) == 2, "a second branch")
    thread = page.settled()
    assert thread[0][1] == question_id and thread[1][1] != first_id, thread
    second_id = thread[1][1]
    assert page.find(f'.message[data-id="{second_id}"] .route').text.startswith(
        f"{chosen} · route: requested"
    )
    picker.select_by_value("auto")
    page.shot("regenerated")

    # Switch back to the first branch, and go on from it; Stop cancels the reply, which stays stored.
    Select(page.find("#branches")).select_by_value(first_id)
    page.until(lambda c: [m[1] for m in page.messages()] == [question_id, first_id], "the first branch")
    assert page.messages()[1][2] == first_reply
    page.shot("first-branch")
    page.find("#prompt").send_keys("And when a region dies?")
    page.find("#send").click()
    page.until(
        lambda c: int(page.find(".message.streaming").get_attribute("data-chunks") or 0) >= 2, "a part"
    )
    page.click("stop")
    thread = page.settled(4)
    assert page.find(f'.message[data-id="{thread[3][1]}"]').get_attribute("data-finish") == "cancelled"
    assert "finished: cancelled" in page.find(f'.message[data-id="{thread[3][1]}"] .finish').text
    assert page.find("#stop").get_attribute("hidden") is not None
    assert [m[1] for m in thread[:2]] == [question_id, first_id], thread
    assert len(Select(page.find("#branches")).options) == 2
    listed = httpx.get(
        f"{web_mesh.edge_url}/v1/conversations/{conversation_id}/messages",
        params={"leaf_id": thread[3][1]},
        headers=auth,
        timeout=10,
    ).json()["data"]
    assert listed[2]["parent_id"] == first_id and listed[3]["finish_reason"] == "cancelled", listed
    page.shot("stopped")

    # Edit the first question: a new branch from the start. The edge refuses it once (429):
    # an error bubble under the question, whose Retry sends it again.
    page.find(f'.message[data-id="{question_id}"] .edit').click()
    page.visible("editing")
    prompt.clear()
    browser.execute_script(_REFUSE_ONCE)
    prompt.send_keys("How does the mesh keep residency?")
    page.find("#send").click()
    failed = page.until(lambda c: page.all(".turn-error"), "the refused turn's error")[0]
    assert failed.find_element(By.CSS_SELECTOR, ".content").text.startswith("429 rate_limit_error")
    assert (
        not page.all(".message.streaming") and page.messages()[-1][2] == "How does the mesh keep residency?"
    )
    page.shot("refused")
    failed.find_element(By.CSS_SELECTOR, ".retry").click()
    page.until(lambda c: len(Select(page.find("#branches")).options) == 3, "the edited branch")
    thread = page.settled()
    assert thread[0][2] == "How does the mesh keep residency?" and thread[0][1] != question_id, thread
    assert not page.all(".turn-error")
    page.shot("edited")

    # A reload finds the conversation in the list (titled by its first words), and opens it again.
    browser.refresh()
    page.visible("app")
    assert len(page.settled(2)) == 2
    item = page.until(
        lambda c: page.all(f'#conversations li[data-id="{conversation_id}"] .open'), "the conversation listed"
    )[0]
    assert item.text == PROMPT
    page.find("#new-chat").click()
    page.until(lambda c: not page.all("#messages .message"), "an empty thread")
    item.click()
    thread = page.settled(2)
    assert thread[0][2] == "How does the mesh keep residency?", thread
    assert len(Select(page.find("#branches")).options) == 3
    page.shot("reloaded")
    Select(page.find("#branches")).select_by_value(second_id)
    page.until(
        lambda c: [m[1] for m in page.messages()] == [question_id, second_id], "the regenerated branch"
    )
    # What the page learnt while the reply streamed (its route) survives the reload.
    assert page.find(f'.message[data-id="{second_id}"] .route').text.startswith(
        f"{chosen} · route: requested"
    )

    # The whole reply copies; a reply holding code (the simulator writes none: the page is handed
    # one in place of the stored reply) shows it highlighted, with a copy button that copies.
    page.find(f'.message[data-id="{second_id}"] .copy').click()
    stored_reply = page.messages()[1][2]
    page.until(lambda c: page.clipboard().strip() == stored_reply, "the reply copied")
    browser.execute_script(_CODE_REPLY_ONCE, CODE_REPLY)
    page.find(f'#conversations li[data-id="{conversation_id}"] .open').click()
    page.until(lambda c: page.all(".message.assistant .code-block"), "the reply with code")
    block = page.find(".message.assistant .code-block")
    assert block.find_element(By.CSS_SELECTOR, ".code-lang").text == "python"
    assert block.find_element(By.CSS_SELECTOR, "code .hljs-keyword").text == "for"
    block.find_element(By.CSS_SELECTOR, ".copy-code").click()
    page.until(lambda c: page.clipboard() == "for i in range(3):\n    print(i)\n", "the code copied")
    assert block.find_element(By.CSS_SELECTOR, ".copy-code .label").text == "Copied"
    page.shot("code")
    page.axe("the chat page (1366x900, light)")
    page.view(LAPTOP, dark=True)
    page.shot("code-dark")
    page.axe("the chat page (1366x900, dark)")
    page.view(LAPTOP)

    # A file the mesh refuses shows the edge's error object; a good one uploads.
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(128, 256)))
    page.find("#file").send_keys(str(binary))
    page.find("#upload-button").click()
    refusal = page.until(lambda c: page.error(), "the upload's refusal")
    assert refusal.startswith("400 invalid_request_error"), refusal
    page.shot("upload-refused")
    upload = tmp_path / "notes.txt"
    upload.write_text("The mesh keeps every conversation in its tenant's zone.\n")
    page.find("#file").send_keys(str(upload))
    page.find("#upload-button").click()
    file_id = page.until(lambda c: page.find("#upload-status").get_attribute("data-file-id"), "the upload")
    assert not page.error()
    stored = httpx.get(f"{web_mesh.edge_url}/v1/files/{file_id}", headers=auth, timeout=10)
    assert stored.status_code == 200 and stored.json()["filename"] == "notes.txt", stored.text
    page.shot("uploaded")

    # The upload went into the key's "web chat files" store; a turn searches it and cites the file.
    stores = httpx.get(f"{web_mesh.edge_url}/v1/vector_stores", headers=auth, timeout=10).json()["data"]
    [store] = [s for s in stores if s["name"] == "web chat files"]
    members = httpx.get(f"{web_mesh.edge_url}/v1/vector_stores/{store['id']}/files", headers=auth, timeout=10)
    assert [m["id"] for m in members.json()["data"]] == [file_id], members.text
    page.find("#new-chat").click()
    page.until(lambda c: not page.all("#messages .message"), "an empty thread")
    page.find("#prompt").send_keys("Where does the mesh keep every conversation?")
    page.find("#send").click()
    page.settled(2)
    sources = page.until(lambda c: page.all("#messages .message.assistant .sources"), "the reply's sources")
    assert sources[0].text.startswith("Sources: [1] notes.txt"), sources[0].text
    page.shot("cited")

    # Delete asks first: Cancel keeps the conversation, Delete removes it from the list and the API.
    page.find(f'#conversations li[data-id="{conversation_id}"] .delete').click()
    dialog = page.visible("confirm-delete")
    assert PROMPT in dialog.text
    page.axe("the delete confirmation")
    page.shot("confirm-delete")
    page.find("#confirm-delete-cancel").click()
    page.until(lambda c: not page.find("#confirm-delete").is_displayed(), "the dialog closed")
    assert page.all(f'#conversations li[data-id="{conversation_id}"]')
    page.find(f'#conversations li[data-id="{conversation_id}"] .delete').click()
    page.visible("confirm-delete")
    page.find("#confirm-delete-yes").click()
    page.until(lambda c: not page.all(f'#conversations li[data-id="{conversation_id}"]'), "the deletion")
    gone = httpx.get(f"{web_mesh.edge_url}/v1/conversations/{conversation_id}", headers=auth, timeout=10)
    assert gone.status_code == 404, gone.text
    assert not page.error() and not page.csp_violations()


def test_chat_page_on_a_phone(web_mesh: RunningMesh, browser: webdriver.Chrome, artifacts: Path) -> None:
    """At 390x844 the conversations are behind a menu; a reply streams and
    the page keeps to the screen's width, light and dark."""
    page = Page(browser, artifacts, "phone")
    page.view(PHONE)
    browser.get(web_mesh.edge_url + "/chat")
    # The tab may still hold the key from the test before.
    shown = page.until(lambda c: [e for e in page.all("#app, #signin") if e.is_displayed()], "the page")
    if shown[0].get_attribute("id") == "signin":
        page.find("#api-key").send_keys(DEV_KEY, Keys.ENTER)
    page.visible("app")
    assert not page.find("#sidebar").is_displayed() and page.find("#menu").is_displayed()
    page.find("#prompt").send_keys("Why keep a stream alive?", Keys.ENTER)
    thread = page.settled(2)
    assert thread[0][2] == "Why keep a stream alive?"
    page.fits(PHONE[0])
    page.shot("thread")
    page.axe("the chat page (390x844, light)")
    page.find("#menu").click()
    page.until(lambda c: page.find("#sidebar").is_displayed(), "the menu open")
    assert page.find("#menu").get_attribute("aria-expanded") == "true"
    page.shot("menu")
    page.axe("the phone menu")
    page.view(PHONE, dark=True)
    page.shot("menu-dark")
    page.find("#new-chat").click()
    page.until(lambda c: not page.find("#sidebar").is_displayed(), "the menu closed")
    page.find("#prompt").send_keys("Dark?")
    page.shot("dark")
    page.axe("the chat page (390x844, dark)")
    page.view(LAPTOP)
    assert not page.csp_violations()


# The next list of messages the page reads has its last reply's text replaced by arguments[0].
_CODE_REPLY_ONCE = """
const real = window.fetch, text = arguments[0];
window.fetch = async (path, init) => {
  const resp = await real(path, init);
  if (!/\\/messages\\?/.test(String(path))) return resp;
  window.fetch = real;
  const body = await resp.json();
  body.data.filter((m) => m.role === 'assistant').slice(-1).forEach((m) => { m.content = text; });
  return new Response(JSON.stringify(body), {status: 200, headers: {'content-type': 'application/json'}});
};
"""


# The next conversation turn the page posts is answered 429 by this stand-in for the edge.
_REFUSE_ONCE = """
const real = window.fetch;
window.fetch = (path, init) => {
  if (init && init.method === 'POST' && String(path).endsWith('/messages')) {
    window.fetch = real;
    const body = {error: {type: 'rate_limit_error', code: 'rate_limited', message: 'too many requests',
      param: null}};
    return Promise.resolve(new Response(JSON.stringify(body), {status: 429,
      headers: {'content-type': 'application/json'}}));
  }
  return real(path, init);
};
"""


def test_operator_page_lists_the_regions(
    web_mesh: RunningMesh, browser: webdriver.Chrome, artifacts: Path
) -> None:
    api = web_mesh.edge_url + "/ops/api/regions"
    assert httpx.get(api, timeout=10).json()["error"]["code"] == "missing_operator_key"
    tenant_key = httpx.get(api, headers={"Authorization": f"Bearer {DEV_KEY}"}, timeout=10)
    assert tenant_key.status_code == 401 and tenant_key.json()["error"]["code"] == "invalid_operator_key"

    # Two turns of its own, besides the chat tests': the charts and usage have data.
    for _ in range(2):
        turn = httpx.post(
            f"{web_mesh.edge_url}/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": "Chart."}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {DEV_KEY}"},
            timeout=30,
        )
        assert turn.status_code == 200, turn.text
    page = Page(browser, artifacts, "ops")
    page.view(LAPTOP)
    browser.get(web_mesh.edge_url + "/ops")
    page.visible("ops-key").send_keys(OPS_KEY)
    page.find("#sign-in").click()
    page.visible("dashboard")
    rows = page.until(lambda c: page.all("#regions tbody tr"), "the regions")
    shown = {r.get_attribute("data-region"): r.get_attribute("data-zone") for r in rows}
    assert shown == web_mesh.zone_of(), shown
    for row in rows:
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        assert cells[3] == "SERVING" and re.fullmatch(r"[1-9]\d* / [1-9]\d*", cells[4]), cells
    page.shot("regions")

    # The chat test's turns reach billing in the background; the page shows them.
    keys = web_mesh.info["keys"]
    assert isinstance(keys, dict)
    tenant = web_mesh.tenant_id(next(zone for zone, key in keys.items() if key == DEV_KEY))
    ops_auth = {"Authorization": f"Bearer {OPS_KEY}"}
    page.until(
        lambda c: (
            httpx.get(
                f"{web_mesh.edge_url}/ops/api/usage",
                params={"tenant_id": tenant},
                headers=ops_auth,
                timeout=10,
            ).json()["requests"]
            > 0
        ),
        "the chat turns to be billed",
    )
    page.find("#tenant-id").send_keys(tenant)
    page.find("#usage-form button").click()
    page.visible("usage")
    usage = {
        row.find_element(By.TAG_NAME, "th").text: row.find_element(By.TAG_NAME, "td").text
        for row in page.all("#usage tr")
    }
    assert usage["tenant"] == tenant and int(usage["requests"]) > 0, usage
    page.shot("usage")
    page.axe("the operator page")

    # The charts hold the turns run so far (the chat tests', and two above) and the regions' load.

    def charted(name: str) -> int:
        return sum(
            int(p.get_attribute("data-points") or 0)
            for p in page.all(f'.chart[data-chart="{name}"] path.line')
        )

    page.until(
        lambda c: (
            charted("Turns per 10 s") and charted("Time to first token") and charted("Healthy engine pods")
        ),
        "charts with data",
    )
    assert page.until(lambda c: page.all("#tenants tbody tr[data-tenant]"), "the tenants served")
    assert page.find(f'#tenants tr[data-tenant="{tenant}"]').is_displayed()
    browser.execute_script("document.getElementById('charts').scrollIntoView()")
    page.shot("charts")
    page.view(LAPTOP, dark=True)
    page.shot("charts-dark")
    page.axe("the operator page's charts (1366x900, dark)")
    for dark in (False, True):
        page.view(PHONE, dark=dark)
        page.fits(PHONE[0])
        browser.execute_script("document.getElementById('charts').scrollIntoView()")
        page.shot("charts-phone-dark" if dark else "charts-phone")

    # The operator's admin certificate, passed on by `llmmesh up`, lets the page manage API keys.
    page.view(LAPTOP)
    page.find(f'#tenants tr[data-tenant="{tenant}"] td').click()
    page.until(lambda c: page.all("#keys tbody tr[data-key]"), "the tenant's keys")
    before = {r.get_attribute("data-key") for r in page.all("#keys tbody tr[data-key]")}
    page.find("#create-key").click()
    secret = page.visible("new-secret").text
    assert secret and "shown only once" in page.find("#new-key").text
    page.find("#copy-secret").click()
    assert page.clipboard() == secret
    (new_id,) = page.until(
        lambda c: {r.get_attribute("data-key") for r in page.all("#keys tbody tr[data-key]")} - before,
        "the new key listed",
    )
    row = page.find(f'#keys tr[data-key="{new_id}"]')
    assert secret.startswith(row.find_elements(By.TAG_NAME, "td")[1].text.rstrip("…"))
    assert secret not in page.find("#keys").text
    page.shot("keys")
    for dark in (False, True):
        page.view(PHONE, dark=dark)
        page.fits(PHONE[0])
        browser.execute_script("document.getElementById('keys-panel').scrollIntoView()")
        page.shot("keys-phone-dark" if dark else "keys-phone")
    page.axe("the operator page's keys (390x844, dark)")
    page.view(LAPTOP)
    page.find(f'#keys tr[data-key="{new_id}"] button.revoke').click()
    page.until(lambda c: c.switch_to.alert, "the confirmation").accept()
    page.until(
        lambda c: "revoked" in page.find(f'#keys tr[data-key="{new_id}"]').text, "the key shown revoked"
    )
    refused = httpx.post(
        f"{web_mesh.edge_url}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", refused.text
    assert not page.error() and not page.csp_violations()
