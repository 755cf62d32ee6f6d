"""Headless Chromium for the page tests (tests only).

The distribution's `chromium` package (.ci/run installs it) renders the
pages rnnstep writes (tests/test_inspect_page.py, tests/test_web_export.py);
where it is missing, the tests that need it skip with the reason
`chromium_binary` gives.
"""

import shutil
import subprocess
import tempfile

TIMEOUT = 120


def chromium_binary():
  """The Chromium to use, or None; and why not."""
  for name in ("chromium", "chromium-browser"):
    binary = shutil.which(name)
    if binary:
      try:
        subprocess.run([binary, "--version"], capture_output=True, check=True,
                       timeout=60)
        return binary, None
      except (OSError, subprocess.SubprocessError) as e:
        return None, f"{binary} --version failed ({e})"
  return None, ("chromium is not installed (.ci/run installs Debian's with "
                "apt-get install chromium)")


def run_chromium(binary, url, *args, width=1000, height=900):
  """Runs headless Chromium on `url` with a fresh profile.

  Args:
    binary: from `chromium_binary`.
    url: the page (a file:// URI).
    *args: more switches (`--dump-dom`, `--screenshot=...`).
    width, height: the window size.

  Returns:
    The `subprocess.CompletedProcess` (stdout, stderr as bytes).

  Raises:
    subprocess.CalledProcessError, subprocess.TimeoutExpired.
  """
  profile = tempfile.mkdtemp(prefix="rnnstep_chromium_")
  try:
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--force-color-profile=srgb", f"--user-data-dir={profile}",
         f"--window-size={width},{height}", *args, url],
        capture_output=True, timeout=TIMEOUT, check=True)
  finally:
    shutil.rmtree(profile, ignore_errors=True)
