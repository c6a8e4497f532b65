#!/usr/bin/env bash
# Install what tests/integration/test_viewer_browser.py needs: Debian's headless Chromium,
# its matching chromedriver, and Selenium in the project's venv.
# Nothing is downloaded by Selenium itself: the test points it at /usr/bin/chromedriver.
set -euo pipefail

PYTHON="${PYTHON:-$(dirname "$0")/../../.venv/bin/python}"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium chromium-driver
fi

if ! "$PYTHON" -c "import selenium" 2>/dev/null; then
    "$PYTHON" -m pip install "selenium>=4.15"
fi

chromium --version
chromedriver --version
"$PYTHON" -c "import selenium; print('selenium', selenium.__version__)"
