"""Images on the chat page in a real browser (Debian's Chromium, headless, Playwright for Python)
against a running `onebit-pipe serve` of a pack whose vision tower is served: the attach button is
shown; an image chosen with the file picker and one dropped on the composer are shown before
sending and can be removed; the message goes out as `image_url` parts with `data:` URLs and is
answered; the turn shows its image; a reload finds it again; nothing leaves the server's origin.
A screenshot goes to OUTDIR. Prints one JSON line with what it saw; exits non-zero on failure.

usage: webui_images.py BASE_URL CHROMIUM IMAGE OUTDIR
"""
import base64
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

base, chromium, image, outdir = sys.argv[1:5]
out = Path(outdir)
out.mkdir(parents=True, exist_ok=True)
origin = urlsplit(base).netloc
png = Path(image).read_bytes()
seen = {}
problems = []
bodies = []

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: urlsplit(r.url).netloc != origin and problems.append(f"request elsewhere: {r.url}"))
    page.on("request", lambda r: r.url.endswith("/v1/chat/completions") and bodies.append(r.post_data_json))
    page.goto(base + "/")
    expect(page.locator("#pack .name")).to_be_visible()
    expect(page.locator("#attach")).to_be_visible()

    # The file picker, then a drop on the composer; the first is removed again.
    page.set_input_files("#attach-file", files=[{"name": "a.png", "mimeType": "image/png", "buffer": png}])
    expect(page.locator("#attached img.thumb")).to_have_count(1)
    page.locator("#attached .attached button").first.click()
    expect(page.locator("#attached img.thumb")).to_have_count(0)
    expect(page.locator("#attached")).to_be_hidden()
    dt = page.evaluate_handle(
        """(b64) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], "drop.png", { type: "image/png" }));
            return dt;
        }""",
        base64.b64encode(png).decode(),
    )
    page.dispatch_event("#composer", "drop", {"dataTransfer": dt})
    expect(page.locator("#attached img.thumb")).to_have_count(1)
    page.fill("#input", "Describe it")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant .stats").first).not_to_have_text("", timeout=60_000)
    seen["stats"] = page.locator(".msg.assistant .stats").first.inner_text()
    assert "error" not in seen["stats"], seen["stats"]
    expect(page.locator(".msg.user img.thumb")).to_have_count(1)
    expect(page.locator("#attached")).to_be_hidden()
    parts = bodies[-1]["messages"][-1]["content"]
    seen["parts"] = [p["type"] for p in parts]
    assert seen["parts"] == ["image_url", "text"], parts
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,"), parts[0]
    page.screenshot(path=str(out / "webui-image.png"))
    page.reload()
    expect(page.locator(".msg.user img.thumb")).to_have_count(1)
    browser.close()

assert not problems, problems
print(json.dumps(seen))
