"""The web chat page and the operator page, driven in a real headless
Chromium (Debian's chromium and chromedriver, through Selenium) against a
real ``llmmesh up --engine sim``: a prompt's reply streams into the page,
a regenerated reply and an edited message make branches the page switches
between, a branch goes on where it was left, the conversation is found
again after a reload, a file uploads, and the operator page lists the
mesh's regions. Screenshots of each step are kept under
``$LLMMESH_ARTIFACTS/web_chat`` (else the test's temporary directory)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
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
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    chrome.set_page_load_timeout(WAIT_S)
    chrome.set_script_timeout(WAIT_S)
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


_THREAD = """
return Array.from(document.querySelectorAll('#messages .message'),
  (m) => [m.dataset.role || '', m.dataset.id || '', m.querySelector('.content').textContent]);
"""

# Records, in the page, the text of the reply being streamed at every DOM change.
_OBSERVE = """
window.__streamed = [];
new MutationObserver(() => {
  const node = document.querySelector('.message.streaming .content');
  if (node) window.__streamed.push(node.textContent);
}).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
"""


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.sources: list[str] = []
        self.styles = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script":
            if named.get("src"):
                self.sources.append(str(named["src"]))
            else:
                self.inline.append(tag)
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
        for src in parsed.sources:
            assert src.startswith("/web/"), src
            asset = httpx.get(web_mesh.edge_url + src, timeout=10)
            assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    missing = httpx.get(web_mesh.edge_url + "/web/../edge/app.py", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_chat_page_streams_branches_and_finds_the_conversation_again(
    web_mesh: RunningMesh, browser: webdriver.Chrome, artifacts: Path, tmp_path: Path
) -> None:
    page = Page(browser, artifacts, "chat")
    auth = {"Authorization": f"Bearer {DEV_KEY}"}
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

    # A prompt's reply streams: the page shows it growing, several times over.
    browser.execute_script(_OBSERVE)
    page.find("#prompt").send_keys(PROMPT)
    page.find("#send").click()
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
    page.shot("streamed")

    # Regenerate: a second branch, shown at once, with the picker.
    page.find(f'.message[data-id="{first_id}"] .regenerate').click()
    page.until(lambda c: len(Select(page.find("#branches")).options) == 2, "a second branch")
    thread = page.settled()
    assert thread[0][1] == question_id and thread[1][1] != first_id, thread
    second_id = thread[1][1]
    page.shot("regenerated")

    # Switch back to the first branch, and go on from it.
    Select(page.find("#branches")).select_by_value(first_id)
    page.until(lambda c: [m[1] for m in page.messages()] == [question_id, first_id], "the first branch")
    assert page.messages()[1][2] == first_reply
    page.shot("first-branch")
    page.find("#prompt").send_keys("And when a region dies?")
    page.find("#send").click()
    thread = page.settled(4)
    assert [m[1] for m in thread[:2]] == [question_id, first_id], thread
    assert len(Select(page.find("#branches")).options) == 2
    listed = httpx.get(
        f"{web_mesh.edge_url}/v1/conversations/{conversation_id}/messages",
        params={"leaf_id": thread[3][1]},
        headers=auth,
        timeout=10,
    ).json()["data"]
    assert listed[2]["parent_id"] == first_id, listed

    # Edit the first question: a new branch from the start.
    page.find(f'.message[data-id="{question_id}"] .edit').click()
    page.visible("editing")
    prompt = page.find("#prompt")
    prompt.clear()
    prompt.send_keys("How does the mesh keep residency?")
    page.find("#send").click()
    page.until(lambda c: len(Select(page.find("#branches")).options) == 3, "the edited branch")
    thread = page.settled()
    assert thread[0][2] == "How does the mesh keep residency?" and thread[0][1] != question_id, thread
    page.shot("edited")

    # A reload finds the conversation in the list, and opens it again.
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

    # Delete: gone from the list and from the API.
    page.find(f'#conversations li[data-id="{conversation_id}"] .delete').click()
    page.until(lambda c: not page.all(f'#conversations li[data-id="{conversation_id}"]'), "the deletion")
    gone = httpx.get(f"{web_mesh.edge_url}/v1/conversations/{conversation_id}", headers=auth, timeout=10)
    assert gone.status_code == 404, gone.text
    assert not page.error() and not page.csp_violations()


def test_operator_page_lists_the_regions(
    web_mesh: RunningMesh, browser: webdriver.Chrome, artifacts: Path
) -> None:
    api = web_mesh.edge_url + "/ops/api/regions"
    assert httpx.get(api, timeout=10).json()["error"]["code"] == "missing_operator_key"
    tenant_key = httpx.get(api, headers={"Authorization": f"Bearer {DEV_KEY}"}, timeout=10)
    assert tenant_key.status_code == 401 and tenant_key.json()["error"]["code"] == "invalid_operator_key"

    page = Page(browser, artifacts, "ops")
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
    assert not page.error() and not page.csp_violations()
