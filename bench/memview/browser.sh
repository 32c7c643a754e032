# Sourced by the scripts beside it: sets $browser to the headless browser
# ($FERRY_CHROMIUM, else Debian's chromium, chromium-browser or
# google-chrome), or exits naming what to install.
browser=${FERRY_CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$browser" ]; then
  echo "no chromium: apt-get install chromium (or set FERRY_CHROMIUM)" >&2
  exit 1
fi
