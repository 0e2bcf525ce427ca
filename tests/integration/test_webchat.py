"""The web chat page, served by the gateway, in headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright; no browser is downloaded): a question typed in is answered as a stream, the
conversation survives a reload, the second turn reuses the first's KV (the stats say so), Chinese
and English, and the page fetches nothing from anywhere but the gateway."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.integration.gatewaytools import LIVE_KEY, Gateway

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")

# Counts the changes of the last answer's text while it streams.
WATCH = """() => {
  window.__updates = 0;
  new MutationObserver(() => { window.__updates += 1; })
    .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    g = Gateway(stack.grpc_url, tmp_path_factory.mktemp("webchat"))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def _answer(page, question: str, timeout_ms=60_000) -> str:
    count = page.locator('[data-testid="msg-assistant"]').count()
    page.fill('[data-testid="input"]', question)
    page.press('[data-testid="input"]', "Enter")
    done = page.locator('[data-testid="msg-assistant"]').nth(count)
    done.locator('[data-testid="stats-toggle"]').wait_for(timeout=timeout_ms)  # shown once the answer is complete
    return done.locator(".text").inner_text()


def _reused(page) -> tuple[int, int]:
    last = page.locator('[data-testid="msg-assistant"]').last
    last.locator('[data-testid="stats-toggle"]').click()
    stats = last.locator('[data-testid="stats"]')
    assert stats.is_visible()
    m = re.search(r"(\d+) (?:of|/) (\d+)", stats.inner_text())
    assert m, stats.inner_text()
    return int(m.group(1)), int(m.group(2))


def test_a_customer_chats_in_the_browser(gateway, browser, tmp_path):
    context = browser.new_context(viewport={"width": 900, "height": 760}, locale="en-US")
    page = context.new_page()
    foreign, errors = [], []
    page.on("request", lambda r: None if r.url.startswith(gateway.url) else foreign.append(r.url))
    statuses = []  # (url, status): the page's requests, checked below
    page.on("response", lambda r: statuses.append((r.url, r.status)))
    # Network failures are checked by status below (the first /v1/models without a key is a 401).
    page.on(
        "console", lambda m: errors.append(m.text) if m.type == "error" and "Failed to load" not in m.text else None
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(gateway.url, wait_until="networkidle")

    assert page.locator("#settings").is_visible()  # the gateway wants a key: the page asks for one
    page.fill('[data-testid="key"]', LIVE_KEY)
    page.press('[data-testid="key"]', "Tab")
    page.check('[data-testid="priority"]')  # an agent: priority 1, every token sent as it comes
    page.evaluate(WATCH)
    first = _answer(page, "Where is my order?")
    assert first.strip()
    assert page.evaluate("window.__updates") >= 3, "the answer arrived in one piece, not streamed"
    assert "priority 1" in page.locator('[data-testid="msg-assistant"]').last.inner_text()

    page.reload()  # the conversation is kept (localStorage)
    assert page.locator('[data-testid="msg-user"]').all_inner_texts() == ["Where is my order?"]
    assert page.locator('[data-testid="msg-assistant"] .text').all_inner_texts() == [first]

    page.uncheck('[data-testid="priority"]')
    second = _answer(page, "我的订单什么时候发货？")
    assert re.search(r"[\u4e00-\u9fff]", second), second
    reused, prompt = _reused(page)
    assert reused >= 16 and prompt > reused, (reused, prompt)  # the first turn's blocks, found by content
    assert "time to first token" in page.locator('[data-testid="stats"]').last.inner_text()

    page.click('[data-testid="lang"]')  # 中文
    assert page.locator('[data-testid="send"]').inner_text() == "发送"
    assert "复用" in page.locator('[data-testid="stats"]').last.inner_text()
    page.click('[data-testid="lang"]')

    shot = tmp_path / "webchat.png"
    page.screenshot(path=str(shot))
    if os.environ.get("SWITCHBOARD_SCREENSHOT"):  # docs/webchat.png is made this way
        shutil.copy(shot, os.environ["SWITCHBOARD_SCREENSHOT"])
    assert not foreign, f"the page fetched from elsewhere: {foreign}"
    assert not errors, errors
    bad = [(url, status) for url, status in statuses if status >= 400]
    assert bad == [(f"{gateway.url}/v1/models", 401)], bad

    page.click('[data-testid="new"]')
    assert page.locator('[data-testid="msg-user"]').count() == 0
    context.close()


def test_the_order_tools_demo_looks_an_order_up_and_answers_from_it(gateway, browser):
    """The page's tool loop: the answer's call shown, run by the gateway's fake order service, its
    result sent back as a tool message, the answer to it shown. The model's own choice of tool is
    scored by tool_eval, not here: the first request is sent with tool_choice "required" and the
    next with "none", so what is checked is the page and the server, whatever the model prefers."""
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    sent = []

    def steer(route):
        body = json.loads(route.request.post_data)
        body["tool_choice"] = "required" if not sent else "none"
        sent.append(body)
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", steer)
    page.goto(gateway.url)
    page.fill('[data-testid="key"]', LIVE_KEY)
    page.press('[data-testid="key"]', "Tab")
    page.check('[data-testid="tools"]')
    page.fill('[data-testid="input"]', "Where is my order SB12345675?")
    page.press('[data-testid="input"]', "Enter")
    answers = page.locator('[data-testid="msg-assistant"]')
    answers.nth(1).locator('[data-testid="stats-toggle"]').wait_for(timeout=60_000)  # the answer to the result
    call = page.locator('[data-testid="tool-call"]').first.inner_text()
    assert re.match(r"called (get_order_status|start_return|transfer_to_human)\(\{", call), call
    assert page.locator(".msg.tool").count() >= 1 and "result" in page.locator(".msg.tool").first.inner_text()
    assert answers.nth(1).locator(".text").inner_text().strip()
    assert len(sent) == 2 and [t["function"]["name"] for t in sent[0]["tools"]] == [
        "get_order_status",
        "start_return",
        "transfer_to_human",
    ]
    called, results = sent[1]["messages"][1], sent[1]["messages"][2:]
    assert called["role"] == "assistant" and called["tool_calls"][0]["id"] == results[0]["tool_call_id"]
    assert results[0]["role"] == "tool" and json.loads(results[0]["content"])
    assert page.locator('[data-testid="error"]').is_hidden()
    context.close()


def test_a_refused_question_shows_the_servers_message(gateway, browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(gateway.url)  # no key
    page.fill('[data-testid="input"]', "Hello?")
    page.press('[data-testid="input"]', "Enter")
    error = page.locator('[data-testid="error"]')
    error.wait_for(state="visible", timeout=30_000)
    assert "missing API key" in error.inner_text()
    assert page.locator('[data-testid="msg-user"]').count() == 0  # the question can be sent again
    context.close()


def test_the_page_is_served_with_a_strict_content_security_policy(gateway):
    import urllib.request

    with urllib.request.urlopen(gateway.url + "/") as r:
        assert r.headers["Content-Security-Policy"].startswith("default-src 'self'")
        html = r.read().decode()
    assert "http://" not in html and "https://" not in html
    for asset in ("/static/chat.js", "/static/chat.css"):
        with urllib.request.urlopen(gateway.url + asset) as r:
            assert r.status == 200 and b"https://" not in r.read()
