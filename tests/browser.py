"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
no port, so it also runs inside a network namespace without even a loopback), for the tests that
open report.html as a user would. Network off: a fresh namespace (``unshare -n``) where the
kernel allows it, and always every host name unresolvable and a dead proxy."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


def unshare_prefix() -> str | None:
    """The command that runs a program in a new network namespace here (root: ``unshare -n``;
    else a user namespace, where the kernel allows it), or None."""
    exe = shutil.which("unshare")
    if not exe:
        return None
    for flags in (["-n"], ["-r", "-n"]):
        if subprocess.run([exe, *flags, "true"], capture_output=True).returncode == 0:
            return " ".join([exe, *flags])
    return None


def _high(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium; ``events`` holds every protocol event received."""

    def __init__(self, exe: str, *, offline: bool = True, width: int = 1400, height: int = 1800):
        self.profile = tempfile.mkdtemp(prefix="harness-chromium-")
        # the child's ends above 9: moving them to 3 and 4 never overwrites one another
        r, self._to_browser = os.pipe()
        self._from_browser, w = os.pipe()
        to_browser_r, from_browser_w = _high(r), _high(w)
        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", "--disable-sync",
            "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
            f"--window-size={width},{height}", "about:blank",
        ]  # fmt: skip
        prefix = unshare_prefix() if offline else None
        self.namespaced = prefix is not None
        script = f"exec 3<&{to_browser_r} 4>&{from_browser_w}; exec {prefix or ''} " + " ".join(
            f"'{a}'" for a in args
        )
        self.log = Path(self.profile) / "stderr.log"
        with self.log.open("wb") as log:  # a file, not a pipe: a chatty browser never blocks
            self.proc = subprocess.Popen(
                ["bash", "-c", script],  # bash: dash takes one-digit fds only
                pass_fds=(to_browser_r, from_browser_w),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.session = self._attach()

    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as f:
            while chunk := f.read(65536):
                buf += chunk
                while b"\0" in buf:
                    raw, buf = buf.split(b"\0", 1)
                    msg = json.loads(raw)
                    with self._cv:
                        if "id" in msg:
                            self._replies[msg["id"]] = msg
                        else:
                            self.events.append(msg)
                        self._cv.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30,
             session: bool = True) -> dict[str, Any]:  # fmt: skip
        """One protocol command; its result (raises on the protocol's error)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session and getattr(self, "session", None):
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while msg["id"] not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    err = self.log.read_text(errors="replace")[-2000:]
                    raise TimeoutError(f"{method}: no reply ({err})")
                self._cv.wait(left)
            reply = self._replies.pop(msg["id"])
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for e in self.events:
                    if e["method"] == method:
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} event")
                self._cv.wait(left)

    def _attach(self) -> str:
        targets = self.send("Target.getTargets", session=False)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        return self.send(
            "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}, session=False
        )["sessionId"]

    def open(self, path: Path, width: int = 1400, height: int = 1800) -> None:
        """Load ``path`` from file:// and wait for its load event."""
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": path.resolve().as_uri()})
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and the browser's own error log entries."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args", []))[:500])
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", "")[:500])
        return out

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path) -> None:
        import base64

        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", session=False, timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        shutil.rmtree(self.profile, ignore_errors=True)
