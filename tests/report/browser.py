"""A real headless browser for page tests: Debian's `chromium`, driven over the DevTools protocol (a websocket on
loopback; the page itself loads from a file and reaches no network)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest


def chromium_binary() -> str:
  path = shutil.which("chromium") or shutil.which("chromium-browser")
  if path is None:
    pytest.skip("chromium is not installed (apt-get install chromium)")
  return path


class Browser:
  """One headless chromium with one page; records console errors and uncaught exceptions."""

  def __init__(self, width: int = 1400, height: int = 1100):
    import websocket

    self.profile = tempfile.mkdtemp(prefix="jaxloc-chromium-")
    self.process = subprocess.Popen(
        [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
         f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = os.path.join(self.profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
      if time.time() > deadline or self.process.poll() is not None:
        self.close()
        raise RuntimeError("chromium did not start its DevTools endpoint")
      time.sleep(0.1)
    port = int(open(port_file).read().split("\n")[0])
    from urllib.request import urlopen

    targets = json.loads(urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
    page = next(t for t in targets if t["type"] == "page")
    self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
    self.ids = itertools.count(1)
    self.errors: list[str] = []
    self.call("Runtime.enable")
    self.call("Page.enable")
    self.call("Log.enable")

  def _record(self, message: dict) -> None:
    method, params = message.get("method"), message.get("params", {})
    if method == "Runtime.exceptionThrown":
      self.errors.append(params["exceptionDetails"].get("exception", {}).get("description", "exception"))
    elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
      self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
    elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
      self.errors.append(params["entry"].get("text", "error"))

  def call(self, method: str, **params) -> dict:
    request = next(self.ids)
    self.socket.send(json.dumps({"id": request, "method": method, "params": params}))
    while True:
      message = json.loads(self.socket.recv())
      if message.get("id") == request:
        if "error" in message:
          raise RuntimeError(f"{method}: {message['error']}")
        return message.get("result", {})
      self._record(message)

  def open(self, path: str) -> None:
    self.call("Page.navigate", url="file://" + os.path.abspath(path))
    deadline = time.time() + 30
    while self.evaluate("document.readyState") != "complete":
      if time.time() > deadline:
        raise RuntimeError("the page did not finish loading")
      time.sleep(0.1)

  def evaluate(self, expression: str, wait: bool = False):
    """The value of a JavaScript expression (with `wait`, of the promise it returns)."""
    result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=wait)
    if "exceptionDetails" in result:
      raise RuntimeError(result["exceptionDetails"])
    return result["result"].get("value")

  def click(self, selector: str) -> None:
    """A real mouse click at the centre of the first element matching `selector`."""
    box = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView();"
                        "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
      self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

  def screenshot(self, path: str) -> bytes:
    data = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    with open(path, "wb") as f:
      f.write(data)
    return data

  def close(self) -> None:
    if getattr(self, "socket", None) is not None:
      self.socket.close()
    self.process.kill()
    self.process.wait()
    shutil.rmtree(self.profile, ignore_errors=True)
