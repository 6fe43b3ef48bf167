"""Retake the TensorBoard screenshots of docs/guides/tensorboard.md in headless Chromium.

Runs ``satmon demo``, ``satmon demo --stalled`` and ``satmon replay`` over the demo's checkpoints
into one logdir (a temporary folder: two live runs and the replay of one, ``replay of demo/version_0``),
starts TensorBoard on it, drives Chromium over its DevTools protocol (``--remote-debugging-pipe``: no
websocket package needed) and writes ``tb_scalars.png``, ``tb_verdict_card.png``, ``tb_hparams.png``
and ``tb_custom_scalars.png`` beside this script, each of a tab as it opens. About two minutes on a
laptop CPU; needs ``chromium`` (Debian's package) and Pillow.

    python docs/img/retake_screenshots.py [--chromium /usr/bin/chromium] [--port 6123] [--keep DIR [--reuse]]

Run it from a clone with the clone on ``PYTHONPATH`` (``python -m satmon.cli.main`` must be this
checkout's code). Look at every image before you commit it.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parent
MAX_BYTES = 300_000

# Every element of TensorBoard's Polymer views sits in shadow roots: search them all.
DEEP = """
function deepAll(sel) {
  const out = [];
  (function walk(root) {
    out.push(...root.querySelectorAll(sel));
    for (const el of root.querySelectorAll('*')) if (el.shadowRoot) walk(el.shadowRoot);
  })(document);
  return out;
}
function deepText() {
  const parts = [];
  (function walk(root) {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      for (const n of el.childNodes) if (n.nodeType === 3) parts.push(n.textContent);
    }
  })(document);
  return parts.join(' ');
}
"""


def _high(fd: int) -> int:
    """fd moved to a number above 9 (the original closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return new


class Chrome:
    """Headless Chromium over --remote-debugging-pipe (it reads fd 3, writes fd 4; NUL-framed JSON)."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # The ends chromium gets go above fd 9, so moving them onto 3 and 4 clobbers neither.
        to_chrome_r, from_chrome_w = (_high(to_chrome_r), _high(from_chrome_w))

        flags = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "--window-size=1600,1100",
            "about:blank",
        ]
        # bash (dash takes no fd above 9) moves the pipe ends onto fds 3 and 4 for --remote-debugging-pipe.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', chromium, *flags],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._w = os.fdopen(to_chrome_w, "wb", buffering=0)
        self._r = os.fdopen(from_chrome_r, "rb", buffering=0)
        self._buf = b""
        self._id = 0
        target = self._send("Target.createTarget", None, url="about:blank")["targetId"]
        self._session = self._send("Target.attachToTarget", None, targetId=target, flatten=True)["sessionId"]

    def _send(self, method: str, session: str | None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self._w.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = self._r.read(1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def cmd(self, method: str, **params) -> dict:
        return self._send(method, self._session, **params)

    def js(self, expr: str):
        r = self.cmd("Runtime.evaluate", expression=DEEP + expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(json.dumps(r["exceptionDetails"])[:1000])
        return r["result"].get("value")

    def size(self, width: int, height: int) -> None:
        self.cmd("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def goto(self, url: str, ready: str, timeout: float = 60.0) -> None:
        """Open url and wait until the JS expression ready is true, then let the charts settle."""
        self.cmd("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not self.js(f"(() => {{ try {{ return !!({ready}); }} catch (e) {{ return false; }} }})()"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: not ready after {timeout:.0f} s ({ready})")
            time.sleep(0.5)
        time.sleep(3)  # chart animations and late layout

    def shot(self) -> Image.Image:
        data = self.cmd("Page.captureScreenshot", format="png")["data"]
        return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")

    def close(self) -> None:
        try:
            self._send("Browser.close", None)
        except (RuntimeError, OSError):  # it may close the pipe before it answers
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def save(img: Image.Image, name: str) -> None:
    """Save under docs/img, palette-quantised if the plain PNG is over MAX_BYTES."""
    path = HERE / name
    img.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path}: {img.size[0]}x{img.size[1]}, {path.stat().st_size // 1000} KB")


def satmon(*args: str, cwd: Path) -> None:
    cmd = [sys.executable, "-m", "satmon.cli.main", *args]
    print("$ satmon " + " ".join(args), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--port", type=int, default=6123)
    ap.add_argument("--keep", metavar="DIR", help="write the runs under DIR/satmon_logs (kept), not a temp folder")
    ap.add_argument(
        "--reuse", action="store_true", help="with --keep: screenshot the runs already in DIR/satmon_logs, run nothing"
    )
    args = ap.parse_args()
    if args.reuse and not args.keep:
        ap.error("--reuse needs --keep DIR (the folder of a previous run)")

    work = Path(args.keep or tempfile.mkdtemp(prefix="satmon_shots_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "satmon_logs"
    if not args.reuse:
        satmon("demo", "--logdir", str(logs), "--quiet", cwd=work)
        satmon("demo", "--stalled", "--logdir", str(logs), "--quiet", cwd=work)
        satmon(
            "replay",
            str(logs / "demo" / "version_0" / "checkpoints"),
            "--model",
            "satmon.demos.lit:LitLM",
            "--datamodule",
            "satmon.demos.corpus:CorpusDataModule",
            "--logdir",
            str(logs),
            "--quiet",
            cwd=work,
        )

    base = f"http://127.0.0.1:{args.port}"
    tb = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logs),
            "--port",
            str(args.port),
            "--host",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    chrome = None
    try:
        for _ in range(120):
            try:
                runs = json.load(urllib.request.urlopen(base + "/data/runs", timeout=2))
                if len(runs) >= 3:  # two live runs and a replay, one run each
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            raise TimeoutError("TensorBoard did not list the three runs")
        chrome = Chrome(args.chromium, str(work / "chromium_profile"))
        url = base + "/?darkMode=false#"

        # 1. The Scalars tab as it opens: the Satmon group first, its first chart the decision, every run.
        chrome.size(1600, 1000)
        chrome.goto(url + "scalars", "deepText().includes('Satmon/decision') && deepAll('svg').length > 5")
        save(chrome.shot(), "tb_scalars.png")

        # 2. The Text tab as it opens, every run (the replay's too): the cards first, as the browser shows them.
        chrome.size(1400, 1100)
        chrome.goto(url + "text", "deepAll('#steps-container').length >= 3 && deepAll('table').length >= 2")
        save(chrome.shot(), "tb_verdict_card.png")

        # 3. HParams, table view: satmon/decision and satmon/trust first, the model's own beside them, every run.
        chrome.size(2250, 400)
        chrome.goto(
            url + "hparams",
            "deepText().includes('satmon/decision') && deepText().includes('replay of demo')"
            " && deepText().includes('alpha_init')",
        )
        save(chrome.shot(), "tb_hparams.png")

        # 4. Custom Scalars as it opens, every run.
        chrome.size(1600, 700)
        chrome.goto(
            url + "custom_scalars",
            "deepText().includes('decision (1 GO') && deepText().includes('pooled saturation')"
            " && deepAll('svg').length > 5",
        )
        save(chrome.shot(), "tb_custom_scalars.png")
    finally:
        if chrome is not None:
            chrome.close()
        tb.terminate()
        tb.wait(20)
    print(f"runs in {logs}" if args.keep else f"(runs in {work}, a temp folder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
