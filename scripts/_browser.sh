# Sourced by scripts/test: find the Chromium that the browser tests of awa ui drive
# (tests/test_ui_browser.py, through Playwright; a browser is never downloaded).
# Looks for $AWA_CHROMIUM, then chromium, chromium-browser, google-chrome and
# google-chrome-stable on PATH. None there and running as root with apt-get: installs
# Debian's chromium package (AWA_BROWSER_INSTALL=0 turns that off). Still none: says in one
# line that the browser tests will fail and how to install it. Exports AWA_CHROMIUM
# when it finds one.
browser_tests="tests/test_ui_browser.py"

find_chromium() {
    if [ -n "${AWA_CHROMIUM:-}" ]; then
        echo "$AWA_CHROMIUM"
        return 0
    fi
    for name in chromium chromium-browser google-chrome google-chrome-stable; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
    done
}

chromium_path="$(find_chromium)"
if [ -z "$chromium_path" ] && [ "${AWA_BROWSER_INSTALL:-1}" != 0 ] \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium with apt-get for the browser tests ($browser_tests)" >&2
    if DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
        chromium_path="$(find_chromium)"
    fi
fi
if [ -n "$chromium_path" ]; then
    export AWA_CHROMIUM="$chromium_path"
else
    echo "no Chromium found: $browser_tests will fail (install one, e.g. apt-get install chromium, or set AWA_CHROMIUM)" >&2
fi
