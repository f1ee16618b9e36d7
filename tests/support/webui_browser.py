"""The chat page in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(`executable_path`, so no browser is downloaded), against a running `onebit-pipe serve` that has
an API key. Checks: the key is asked for once; the page loads with no console error and shows the
pack; settings are kept; a message is answered by a stream with its timings; a long answer is
stopped midway with Esc; a reload finds the conversation again; model text holding HTML, a
`javascript:` link and a remote image renders as text, with no dialog and no request; no request
leaves the server's origin. Screenshots at 1280 and 360 px wide (light and dark) go to OUTDIR.
Prints one JSON line with what it saw; exits non-zero on the first failure.

usage: webui_browser.py BASE_URL API_KEY CHROMIUM OUTDIR
"""
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

base, key, chromium, outdir = sys.argv[1:5]
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
origin = urlsplit(base).netloc
seen = {}
problems = []  # console errors, page errors, dialogs, requests elsewhere

XSS = ('Look: <img src=x onerror=alert(1)> and [click me](javascript:alert(2)) and '
       '![pic](http://example.com/x.png)\n\n```js\nalert(3)\n```')


def watch(page):
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("request", lambda r: urlsplit(r.url).netloc != origin and problems.append(f"request elsewhere: {r.url}"))


def answered(page, n):
    """Waits until the n-th answer (1-based) has its stats line."""
    stats = page.locator(".msg.assistant .stats").nth(n - 1)
    expect(stats).not_to_have_text("", timeout=60_000)
    return stats.inner_text()


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    watch(page)
    page.goto(base + "/")
    # The key, asked once.
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key-input", key)
    page.click("#key-form button")
    expect(page.locator("#pack .name")).to_be_visible()
    seen["pack"] = page.inner_text("#pack")
    assert "tokens of context" in seen["pack"] and "verified" in seen["pack"], seen["pack"]

    # Settings, kept per conversation.
    page.click("#toggle-settings")
    # The tiny test model writes blank lines unless sampled wide.
    for field, value in (("max_tokens", "24"), ("temperature", "2"), ("top_k", "0"),
                         ("top_p", "1"), ("min_p", "0"), ("seed", "5")):
        page.fill(f"#set-{field}", value)
    page.click("#toggle-settings")
    page.fill("#input", "the cat sat")
    page.keyboard.press("Enter")
    stats = answered(page, 1)
    assert "ms to first token" in stats and "tokens" in stats, stats
    seen["answer_stats"] = stats
    seen["answer"] = page.locator(".msg.assistant .markdown").nth(0).inner_text()
    assert seen["answer"].strip(), "a visible answer"

    # Shift+Enter adds a line; a long answer, streamed slowly, is stopped midway with Esc.
    page.click("#toggle-settings")
    page.fill("#set-max_tokens", "2000")
    page.click("#toggle-settings")
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": 1500, "uploadThroughput": -1})
    page.click("#input")
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    assert page.input_value("#input") == "line one\nline two"
    page.keyboard.press("Enter")
    expect(page.locator("#send")).to_have_text("Stop")
    expect(page.locator(".msg.assistant .markdown").nth(1)).not_to_have_text("", timeout=30_000)
    page.keyboard.press("Escape")
    stopped = answered(page, 2)
    assert "stopped" in stopped and not stopped.startswith("0 tokens"), stopped
    expect(page.locator("#send")).to_have_text("Send")
    seen["stopped_stats"] = stopped
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})

    # A reload finds the conversation again (the key is kept for the session).
    page.reload()
    expect(page.locator("#pack .name")).to_be_visible()
    expect(page.locator(".msg.user")).to_have_count(2)
    assert page.locator(".msg.user .text").nth(1).inner_text() == "line one\nline two"
    assert page.locator("#chats .chat.open").inner_text() == "the cat sat"
    page.set_viewport_size({"width": 1280, "height": 800})
    page.screenshot(path=str(out / "webui-1280.png"))

    # Model text that tries HTML, script links and remote images renders as text.
    page.evaluate("""(xss) => {
        const chats = JSON.parse(localStorage.getItem('onebit-pipe.chats.v1'));
        chats.unshift({id: 'xss', title: 'xss', created: 0, system: '', settings: {},
                       messages: [{role: 'user', content: 'hi'},
                                  {role: 'assistant', content: xss, reasoning: 'I think <b>so</b>'}]});
        localStorage.setItem('onebit-pipe.chats.v1', JSON.stringify(chats));
        localStorage.setItem('onebit-pipe.current.v1', 'xss');
    }""", XSS)
    page.reload()
    md = page.locator(".msg.assistant .markdown").first
    expect(md).to_contain_text("<img src=x onerror=alert(1)>")
    expect(md).to_contain_text("click me")
    expect(md).to_contain_text("![pic](http://example.com/x.png)")
    assert page.locator("#messages img").count() == 0
    assert page.locator("#messages a[href^='javascript']").count() == 0
    assert page.locator("#messages script").count() == 0
    expect(page.locator(".msg.assistant .thinking")).to_contain_text("I think <b>so</b>")
    page.wait_for_timeout(500)
    seen["xss_rendered"] = md.inner_text()[:80]

    # Narrow and dark.
    page.set_viewport_size({"width": 360, "height": 740})
    page.wait_for_timeout(400)  # the list slides away
    page.screenshot(path=str(out / "webui-360.png"))
    expect(page.locator("#open-side")).to_be_visible()
    page.click("#open-side")
    expect(page.locator("#new-chat")).to_be_in_viewport()
    page.wait_for_timeout(400)
    page.screenshot(path=str(out / "webui-360-list.png"))
    page.emulate_media(color_scheme="dark")
    page.click("#close-side")
    page.wait_for_timeout(400)
    page.screenshot(path=str(out / "webui-360-dark.png"))
    browser.close()

assert not problems, problems
seen["screenshots"] = sorted(f.name for f in out.glob("webui-*.png"))
print(json.dumps(seen))
