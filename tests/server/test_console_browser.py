"""The web console in a real browser: headless Chromium (Debian's, driven through chromedriver by
selenium) against a real server on the default model. It enters the key, chats twice and sees the
second answer's token bar show the cached share the API reported, adds a document to a collection and
asks about it, reads the cache view; it measures the page's weight and when it became usable.

Skipped, saying why, without chromium and chromedriver (`make install-browser`). Screenshots and the
measurements go to $RADIXSERVE_CONSOLE_SHOTS when set (else the test's temporary directory).
"""

import json
import os
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import API_KEY

pytestmark = [pytest.mark.model]

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
WAIT_S = 120  # the longest a step may take (an answer on a busy 2-core machine)
USABLE_WITHIN_MS = 1000  # loopback: the page answers input within this long of navigation start


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("the console's browser test needs Debian's chromium and chromium-driver: make install-browser")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra: make install")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must not look for drivers online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1440,900", "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    directory = os.environ.get("RADIXSERVE_CONSOLE_SHOTS")
    path = Path(directory) if directory else tmp_path_factory.mktemp("console-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wait(driver, condition, message: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: condition(d), message)


def _css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def _type(driver, selector: str, text: str) -> None:
    field = _css(driver, selector)[0]
    field.clear()
    field.send_keys(text)


def _send(driver, text: str) -> dict:
    """Send a chat message; wait for its answer's token bar; return the bar's data attributes."""
    num_before = len(_css(driver, ".message.assistant .origins"))
    _type(driver, "#chat-input", text)
    _css(driver, "#chat-send")[0].click()
    _wait(driver, lambda d: len(_css(d, ".message.assistant .origins")) > num_before, "no token bar under the answer")
    bar = _css(driver, ".message.assistant .origins")[-1]
    attributes = {name: bar.get_attribute(f"data-{name}") for name in
                  ("request-id", "prompt-tokens", "cached-tokens", "api-cached-tokens")}
    attributes["segments"] = {segment.get_attribute("data-origin"): int(segment.get_attribute("data-tokens"))
                              for segment in bar.find_elements("css selector", ".segment")}
    attributes["answer"] = _css(driver, ".message.assistant .content")[-1].text
    return attributes


def _page_timing(driver) -> dict:
    return driver.execute_script("""
        const entries = [performance.getEntriesByType("navigation")[0],
                         ...performance.getEntriesByType("resource").filter((e) => e.name.includes("/console/"))];
        const paint = performance.getEntriesByName("first-contentful-paint")[0];
        return {bytes_transferred: entries.reduce((sum, e) => sum + e.transferSize, 0),
                bytes_decoded: entries.reduce((sum, e) => sum + e.decodedBodySize, 0),
                num_files: entries.length,
                first_contentful_paint_ms: paint ? paint.startTime : null,
                usable_ms: performance.getEntriesByName("console-ready")[0].startTime};""")


def test_the_console_chats_shows_token_origins_and_uses_a_collection(browser, server, shots):
    """On the shared test server (its key API_KEY; the tests' other requests share its cache)."""
    driver, base = browser, server.base_url
    # A first visit: no key stored; the page asks for one (the server has keys).
    driver.get(base + "/")
    _wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "page never ready")
    _wait(driver, lambda d: _css(d, "#key-dialog[open]"), "no key dialog on a server with keys")
    driver.save_screenshot(str(shots / "key-dialog.png"))
    _type(driver, "#key-input", API_KEY)
    _css(driver, "#key-save")[0].click()
    _wait(driver, lambda d: _css(d, "#model-name")[0].text == server.model, "the model's name never showed")

    # A fresh load with the key stored, the browser's cache off: how heavy the page is, when it is usable.
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    driver.get(base + "/")
    _wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "page never ready")
    timing = _page_timing(driver)
    (shots / "page-timing.json").write_text(json.dumps(timing, indent=2))
    print(f"\nconsole page: {json.dumps(timing)}")
    assert timing["usable_ms"] < USABLE_WITHIN_MS and timing["bytes_transferred"] > 0
    driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": False})

    _type(driver, "#setting-max_tokens", "8")
    _type(driver, "#setting-temperature", "0")
    first = _send(driver, "Hello! Who are you?")
    assert first["answer"].strip()
    second = _send(driver, "Thanks. Say one more thing.")
    # The bar shows what the API reported: the first turn's pages served by the prefix cache.
    assert int(second["cached-tokens"]) == int(second["api-cached-tokens"]) > 0
    assert second["segments"].get("prefix_cache", 0) > 0
    assert sum(second["segments"].values()) == int(second["prompt-tokens"])
    record = httpx.get(f"{base}/v1/requests/{second['request-id']}", timeout=30,
                       headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert {k: v for k, v in record["prompt_token_sources"].items() if v} == second["segments"]
    driver.save_screenshot(str(shots / "chat.png"))

    # Tools: the example definition, a forced call shown as a card, its result typed in and answered.
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    _css(driver, "#new-chat")[0].click()
    if not _css(driver, "#tools-settings[open]"):
        _css(driver, "#tools-settings summary")[0].click()
    _css(driver, "#tools-settings button")[0].click()  # "Insert example": get_weather(city)
    Select(_css(driver, "#setting-tool_choice")[0]).select_by_value("required")
    _type(driver, "#setting-max_tokens", "48")
    _type(driver, "#chat-input", "What is the weather in Paris?")
    _css(driver, "#chat-send")[0].click()
    _wait(driver, lambda d: _css(d, ".tool-card .tool-result"), "no tool call card")
    assert "get_weather" in _css(driver, ".tool-card")[0].text
    Select(_css(driver, "#setting-tool_choice")[0]).select_by_value("auto")
    _type(driver, "#setting-max_tokens", "8")
    _css(driver, ".tool-card .tool-result")[0].send_keys("18 degrees and sunny")
    _css(driver, ".tool-cards button.primary")[0].click()
    _wait(driver, lambda d: len(_css(d, ".message.tool")) == 1 and len(_css(d, ".message.assistant .origins")) == 2,
          "no answer after the tool's result")
    driver.save_screenshot(str(shots / "chat-tools.png"))
    tools = _css(driver, "#setting-tools")[0]
    tools.send_keys(Keys.CONTROL, "a")
    tools.send_keys(Keys.DELETE)  # no tools for what follows

    # Collections: create one, add a file (the file input; drop events take the same path), search it.
    _css(driver, "#tab-collections")[0].click()
    collection = f"console-{uuid.uuid4().hex[:8]}"  # the shared server's collections outlive the run
    _type(driver, "#collection-name", collection)
    _css(driver, "#create-collection button")[0].click()
    _wait(driver, lambda d: _css(d, "#collection-detail")[0].is_displayed(), "the new collection never opened")
    note = shots / "zephyr-notes.txt"
    # over the server's shortest stored span (64 tokens): adding it computes its document KV
    note.write_text("Project Zephyr is the team's new weather station. The codename of project Zephyr is "
                    "BLUE HERON. It measures wind speed, air pressure, humidity and temperature on the roof of "
                    "building seven every minute, and sends the readings to the lab's server over the campus "
                    "network. The station runs on a small solar panel with a battery that lasts three days "
                    "without sun. Its first readings were taken in the spring, after two months of tests.\n")
    _css(driver, "#file-input")[0].send_keys(str(note))
    _wait(driver, lambda d: _css(d, ".upload.done") or _css(d, ".upload.failed"), "the upload never ended")
    assert _css(driver, ".upload.done"), _css(driver, ".upload")[0].text
    assert "0 tokens of KV computed" not in _css(driver, ".upload.done")[0].text
    _type(driver, "#search-query", "codename of Zephyr")
    _css(driver, "#search-form button")[0].click()
    _wait(driver, lambda d: _css(d, "#search-results li"), "no search results")
    assert "BLUE HERON" in _css(driver, "#search-results li")[0].text
    driver.save_screenshot(str(shots / "collections.png"))

    # Ask about it in a new chat, retrieving from the collection.
    _css(driver, "#tab-chat")[0].click()
    _css(driver, "#new-chat")[0].click()
    _wait(driver, lambda d: d.find_elements("css selector", f"#setting-collection option[value='{collection}']"),
          "the collection never showed in the chat settings")
    if not _css(driver, "#documents-settings[open]"):
        _css(driver, "#documents-settings summary")[0].click()
    Select(_css(driver, "#setting-collection")[0]).select_by_value(collection)
    _type(driver, "#setting-max_tokens", "16")
    asked = _send(driver, "What is the codename of project Zephyr?")
    retrieved = _css(driver, ".message.assistant .retrieved")[-1].text
    assert "zephyr-notes.txt#0" in retrieved and asked["answer"].strip()
    assert sum(asked["segments"].values()) == int(asked["prompt-tokens"])
    assert asked["segments"].get("document_store", 0) > 0  # the chunk's KV, computed when it was added
    driver.save_screenshot(str(shots / "chat-rag.png"))

    # The cache view: its charts while requests run, and this tenant's prefixes.
    _css(driver, "#tab-cache")[0].click()
    _wait(driver, lambda d: _css(d, "#prefixes tr.prefix"), "no cached prefixes listed")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as client:
        for question in ("Name a colour.", "Name a colour!", "Name a fruit."):
            client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}],
                                                      "max_tokens": 8})
    driver.execute_script("return new Promise((resolve) => setTimeout(resolve, 4500))")  # two more scrapes
    # read in one go: the view rebuilds its tiles every 2 s
    assert "–" not in driver.execute_script("return document.querySelector('#tile-hit-rate').textContent")
    driver.save_screenshot(str(shots / "cache.png"))
    driver.execute_script("document.querySelector('#prefixes').scrollIntoView()")
    driver.save_screenshot(str(shots / "cache-prefixes.png"))
    httpx.delete(f"{base}/v1/collections/{collection}", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)

    # The key never went into a URL: not the page's, not any request's it made.
    urls = driver.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert all(API_KEY not in url for url in [driver.current_url, *urls])
