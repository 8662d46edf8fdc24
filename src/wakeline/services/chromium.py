"""Debian's Chromium, for the dashboard's browser test (headless).

``ensure_chromium()`` returns the browser's path, installing the Debian package
``chromium`` with apt when it is missing and we are root (``wakeline services
fetch`` does this before the tests run); otherwise it raises with what to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from wakeline.errors import PrerequisiteMissing

DEBIAN_PATH = Path("/usr/bin/chromium")
INSTALL = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]


def find_chromium() -> str | None:
    if os.environ.get("WAKELINE_CHROMIUM"):
        return os.environ["WAKELINE_CHROMIUM"]
    if DEBIAN_PATH.exists():
        return str(DEBIAN_PATH)
    return shutil.which("chromium")


def ensure_chromium(*, timeout: float = 900.0) -> str:
    found = find_chromium()
    if found:
        return found
    hint = ("install it with `sudo apt-get install -y --no-install-recommends chromium` "
            "(Debian's package, /usr/bin/chromium), or point WAKELINE_CHROMIUM at a "
            "Chromium binary")
    if shutil.which("apt-get") is None:
        raise PrerequisiteMissing(f"Chromium is missing and there is no apt-get here: {hint}")
    if os.geteuid() != 0:
        raise PrerequisiteMissing(f"Chromium is missing and installing it needs root: {hint}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("chromium: installing the Debian package (apt-get install chromium)", flush=True)
    done = subprocess.run(INSTALL, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        # A fresh machine may have no package lists yet.
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True,
                       timeout=timeout)
        done = subprocess.run(INSTALL, env=env, capture_output=True, text=True, timeout=timeout)
    found = find_chromium()
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise PrerequisiteMissing(f"apt-get could not install chromium (exit "
                                  f"{done.returncode}): {hint}\n{tail}")
    return found
