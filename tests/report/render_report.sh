#!/usr/bin/env bash
# Usage: render_report.sh REPORT_HTML [--sort COLUMN[:desc] [--order ID,ID,...]] [CHART...]
#
# Opens a report.html (written by dettrial's write_report / --report) in headless Chromium, as a
# user's browser would, offline:
#   - its script ran: <body data-ready="1"> in the DOM after load;
#   - each CHART named is an <svg data-chart="CHART"> with at least one series that has points,
#     and every polyline of the page has as many x,y pairs as its data-points says;
#   - with --sort, the page loaded with #sort=COLUMN[:desc] shows the trials' table sorted by that
#     column (a numeric one in order, blanks last); with --order, its rows (data-trial) are in
#     exactly that order;
#   - a screenshot (REPORT_HTML with .png for .html, 1280x2000) is written and is not blank.
# Exits 0 when all hold, 1 when one does not, 77 (a CTest skip) when no Chromium is installed.
# CHROMIUM names the browser to use (default: the first of chromium, chromium-browser,
# google-chrome, google-chrome-stable on the PATH).
set -uo pipefail

fail() { echo "render_report.sh: $*"; exit 1; }
[ $# -ge 1 ] || { echo "usage: render_report.sh REPORT_HTML [--sort COLUMN[:desc] [--order ID,...]] [CHART...]" >&2; exit 2; }
report=$1
shift
sort_spec="" order="" charts=()
while [ $# -gt 0 ]; do
  case $1 in
    --sort) sort_spec=${2:?--sort needs COLUMN[:desc]}; shift 2 ;;
    --order) order=${2:?--order needs ID,ID,...}; shift 2 ;;
    *) charts+=("$1"); shift ;;
  esac
done
[ -f "$report" ] || fail "no such file: $report"

browser=${CHROMIUM:-}
if [ -z "$browser" ]; then
  for candidate in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$candidate" >/dev/null 2>&1; then browser=$(command -v "$candidate"); break; fi
  done
fi
if [ -z "$browser" ]; then
  echo "skipped: no Chromium on the PATH (Debian: apt-get install chromium; or set CHROMIUM)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A file: URL (spaces and the like escaped), with the table's sort in its fragment.
url=$(python3 -c 'import pathlib, sys, urllib.parse
url = pathlib.Path(sys.argv[1]).resolve().as_uri()
print(url + ("#sort=" + urllib.parse.quote(sys.argv[2], safe=":") if sys.argv[2] else ""))' "$report" "$sort_spec") ||
  fail "cannot make a URL of $report"

# Its own profile (parallel tests, no writable HOME); no network is needed: the page has nothing to fetch.
browse() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --no-default-browser-check --disable-extensions --user-data-dir="$work/profile" --virtual-time-budget=2000 "$@"
}

browse --dump-dom "$url" >"$work/dom.html" 2>"$work/browser.log"
status=$?
if [ "$status" -ne 0 ] || [ ! -s "$work/dom.html" ]; then
  tail -n 20 "$work/browser.log"
  fail "$browser --dump-dom exited with status $status and $(wc -c <"$work/dom.html") bytes"
fi

python3 - "$work/dom.html" "$sort_spec" "$order" "${charts[@]}" <<'PY' || exit 1
import html.parser, sys

dom_path, sort_spec, order, charts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

class Dom(html.parser.HTMLParser):
    """The few things the checks need: body's attributes, each chart's series, the table's rows."""
    def __init__(self):
        super().__init__()
        self.body = {}
        self.charts = {}      # name -> [(tag, series, data-points, pairs or None)]
        self.chart = None
        self.rows = []        # data-trial of each row of table#trials, in order
        self.columns = []     # (data-column, data-type) of its header
        self.values = []      # each row's cells' data-value
        self.in_trials = False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "svg" and "data-chart" in a:
            self.chart = a["data-chart"]
            self.charts.setdefault(self.chart, [])
        elif self.chart is not None and "data-series" in a:
            pairs = None
            if tag == "polyline":
                pairs = len((a.get("points") or "").split())
            self.charts[self.chart].append((tag, a["data-series"], int(a.get("data-points", "-1")), pairs))
        elif tag == "table" and a.get("id") == "trials":
            self.in_trials = True
        elif tag == "th" and self.in_trials and "data-column" in a:
            self.columns.append((a["data-column"], a.get("data-type")))
        elif tag == "tr" and self.in_trials and "data-trial" in a:
            self.rows.append(a["data-trial"])
            self.values.append([])
        elif tag == "td" and self.in_trials and self.values:
            self.values[-1].append(a.get("data-value") or "")
    def handle_endtag(self, tag):
        if tag == "svg":
            self.chart = None
        elif tag == "table":
            self.in_trials = False

dom = Dom()
dom.feed(open(dom_path, encoding="utf-8", errors="replace").read())
problems = []
if dom.body.get("data-ready") != "1":
    problems.append("the page's script did not run: <body> has no data-ready=\"1\"")
for name, series in dom.charts.items():
    for tag, label, points, pairs in series:
        if pairs is not None and pairs != points:
            problems.append(f"chart {name!r}, series {label!r}: data-points={points} but {pairs} x,y pairs drawn")
for name in charts:
    if name not in dom.charts:
        problems.append(f"no chart {name!r} (the page has: {', '.join(sorted(dom.charts)) or 'none'})")
    elif not any(points > 0 for _, _, points, _ in dom.charts[name]):
        problems.append(f"chart {name!r} has no series with points")
if sort_spec:
    column, _, direction = sort_spec.rpartition(":") if sort_spec.endswith((":asc", ":desc")) else (sort_spec, "", "asc")
    names = [name for name, _ in dom.columns]
    if column not in names:
        problems.append(f"the table has no column {column!r} to sort by (it has: {', '.join(names)})")
    else:
        index = names.index(column)
        cells = [row[index] if index < len(row) else "" for row in dom.values]
        filled = [c for c in cells if c != ""]
        if cells[:len(filled)] != filled:
            problems.append(f"sorted by {column}: blank cells are not last: {cells}")
        elif dom.columns[index][1] == "number":
            numbers = [float(c) for c in filled]
            if numbers != sorted(numbers, reverse=direction == "desc"):
                problems.append(f"not sorted by {sort_spec}: {filled}")
    if not order and not dom.rows:
        problems.append("--sort given but the page has no table#trials rows")
if order:
    expected = order.split(",")
    if dom.rows != expected:
        problems.append(f"trials in the order {','.join(dom.rows)}, expected {order}")
for p in problems:
    print("render_report.sh:", p)
if problems:
    sys.exit(1)
print(f"rendered: data-ready=1, {len(dom.charts)} charts" + (f", rows {','.join(dom.rows)}" if dom.rows else ""))
PY

# The screenshot, beside the report: what a reviewer looks at; a blank page compresses to almost nothing.
png=${report%.html}.png
rm -f "$png"
browse --hide-scrollbars --window-size=1280,2000 --screenshot="$(readlink -f "$(dirname "$png")")/$(basename "$png")" "$url" \
  >"$work/screenshot.log" 2>&1 || { tail -n 20 "$work/screenshot.log"; fail "$browser --screenshot failed"; }
[ -f "$png" ] || fail "no screenshot written at $png"
size=$(wc -c <"$png")
[ "$size" -gt 20000 ] || fail "the screenshot $png is $size bytes: the page looks blank"
echo "ok: $report renders offline (screenshot: $png, $size bytes)"
