#!/usr/bin/env bash
# Install what the console's browser tests need: Debian's Chromium and its
# WebDriver (chromedriver). Idempotent: installs only what is missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "chromium and chromedriver are installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q chromium chromium-driver
command -v chromium && command -v chromedriver
