"""Headless Chromium: a screenshot of a page, and what the page said on its console; a page served over http that
posts a result (WebGPU on SwiftShader)."""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.release import REPO

SETUP = REPO / "tools" / "setup-chromium.sh"
_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]? (.*)")


@dataclass
class PageRun:
    returncode: int
    screenshot: Path
    console: list[str]  # every console message, errors and uncaught exceptions included
    log: str


def chromium() -> str:
    """The chromium binary, installed by tools/setup-chromium.sh if missing."""
    found = shutil.which("chromium")
    if found is None:
        subprocess.run(["bash", str(SETUP)], check=True)
        found = shutil.which("chromium")
    assert found, "chromium is not installed and tools/setup-chromium.sh could not install it"
    return found


#: Headless, no sandbox (root in a container), nothing fetched from the network on its own.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
)


def screenshot(page: Path, png: Path, *, width: int = 1100, height: int = 3000) -> PageRun:
    with tempfile.TemporaryDirectory(prefix="onnxsmith-chromium-") as profile:
        done = subprocess.run(
            [
                chromium(),
                *HEADLESS_FLAGS,
                "--disable-gpu",
                "--disable-quic",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--enable-logging=stderr",
                "--v=0",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    console = [m.group(1) for line in done.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return PageRun(done.returncode, png, console, done.stderr)


#: WebGPU without a GPU: Chromium's SwiftShader adapter (Vulkan on the CPU; no shader-f16).
WEBGPU_FLAGS = ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan")


def run_page(root: Path, page: str, files: dict[str, Path], *, timeout: float = 180) -> dict:
    """Serve ``root`` (and each of ``files`` at its URL path) on 127.0.0.1, open ``page`` (a path and query under
    it) in headless Chromium with WebGPU on SwiftShader and return the JSON the page POSTs to ``result``."""
    posted: dict = {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path: str) -> str:
            served = files.get(path.split("?", 1)[0].lstrip("/"))
            return str(served) if served is not None else super().translate_path(path)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            posted["result"] = json.loads(body)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
    with tempfile.TemporaryDirectory(prefix="onnxsmith-chromium-") as profile:
        browser = subprocess.Popen(
            [
                chromium(),
                *HEADLESS_FLAGS,
                "--disable-gpu-sandbox",
                *WEBGPU_FLAGS,
                "--remote-debugging-port=0",  # keeps it running until the page has posted
                f"--user-data-dir={profile}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + timeout
            while "result" not in posted and time.monotonic() < deadline and browser.poll() is None:
                time.sleep(0.2)
        finally:
            browser.kill()
            _, log = browser.communicate()
            server.shutdown()
    assert "result" in posted, f"the page posted nothing in {timeout} s; chromium said:\n{log[-3000:]}"
    return posted["result"]
