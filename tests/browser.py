"""Headless Chromium for the `ui` tests, driven over the DevTools protocol.

Debian's ``chromium`` package (``make test-ui`` installs it); the protocol's websocket goes through aiohttp, which
MLflow and Ray already install. Only what the tests need: open a page, wait until its text holds given strings
(MLflow's UI is a JavaScript app that fills in after load), evaluate JavaScript, take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1600, 1000), timeout: float = 60.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError(
                "no chromium on PATH: `apt-get install -y chromium` (make test-ui does it as root)"
            )
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a profile used before holds the last run's port
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not start its DevTools endpoint within {timeout:.0f} s")
            time.sleep(0.2)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.session: Any = None
        self.ids = itertools.count(1)
        try:
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next(t for t in json.loads(r.read()) if t["type"] == "page")
            self.loop = asyncio.new_event_loop()
            self.ws = self.loop.run_until_complete(self._connect(page["webSocketDebuggerUrl"]))
        except BaseException:
            self.close()
            raise

    async def _connect(self, url: str) -> Any:
        import aiohttp

        self.session = aiohttp.ClientSession()
        return await self.session.ws_connect(url, max_msg_size=0)

    async def _call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        i = next(self.ids)
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params or {}}))
        while True:
            msg = json.loads((await self.ws.receive(timeout=120)).data)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.loop is not None, "the browser is closed"
        return self.loop.run_until_complete(self._call(method, params))

    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def eval(self, js: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": js, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"javascript failed: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def text(self) -> str:
        return str(self.eval("document.body ? document.body.innerText : ''") or "")

    def wait_for(self, needles: Sequence[str], timeout: float = 180.0) -> str:
        """The page's visible text once it holds every needle; an error naming the missing ones otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            missing = [n for n in needles if n not in text]
            if not missing:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"page never showed {missing} within {timeout:.0f} s; it shows: {text[:1500]!r}"
                )
            time.sleep(1.0)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            if self.session is not None:
                loop.run_until_complete(self.session.close())
            loop.close()
            self.loop = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
