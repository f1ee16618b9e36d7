"""The chat page on a server of several packs, in Debian's Chromium driven by Playwright: the
picker lists every pack (marked loaded or not, verified or not); the chosen one's facts show
before it loads; a message to it shows its load as it goes, then its answer; it is then marked
loaded; the choice survives a reload. No console error, no request elsewhere.

usage: webui_models.py BASE_URL CHROMIUM MODEL OUTFILE.png
"""
import json
import sys
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

base, chromium, model, shot = sys.argv[1:5]
origin = urlsplit(base).netloc
seen = {}
problems = []

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: urlsplit(r.url).netloc != origin and problems.append(f"request elsewhere: {r.url}"))
    page.goto(base + "/")
    picker = page.locator("#model")
    expect(picker).to_be_visible()
    seen["options"] = picker.locator("option").all_inner_texts()
    picker.select_option(model)
    expect(page.locator("#pack")).to_contain_text("loads with your first message")
    seen["before"] = page.inner_text("#pack")
    # Record every state the header goes through while the message is answered.
    page.evaluate("""() => {
        window.headers = [];
        new MutationObserver(() => window.headers.push(document.getElementById('pack').innerText))
            .observe(document.getElementById('pack'), {childList: true, subtree: true, characterData: true});
    }""")
    page.click("#toggle-settings")
    for field, value in (("max_tokens", "12"), ("temperature", "2"), ("seed", "3")):
        page.fill(f"#set-{field}", value)
    page.click("#toggle-settings")
    page.fill("#input", "hello")
    page.keyboard.press("Enter")
    stats = page.locator(".msg.assistant .stats").first
    expect(stats).not_to_have_text("", timeout=60_000)
    expect(page.locator("#model option:checked")).to_contain_text("loaded")
    seen["headers"] = page.evaluate("window.headers")
    seen["after"] = page.inner_text("#pack")
    page.screenshot(path=shot)
    page.reload()
    expect(page.locator("#model")).to_have_value(model)
    seen["after_reload"] = page.input_value("#model")
    browser.close()
seen["problems"] = problems
print(json.dumps(seen))
sys.exit(1 if problems else 0)
