"""Security of the plugin in real TensorBoard processes and the real tab in headless Chromium.

- Static route: path traversal and odd encodings (``..``, ``%2e%2e``, ``%2f``,
  double encoding, backslashes, NUL, overlong UTF-8, absolute paths, symlinks
  out of the folder) never serve anything outside ``tb_introspect/static``
  and never answer 500. Requests are sent byte for byte over a socket.
- Query parameters: oversized, repeated, malformed, out-of-range and
  header-injecting values get a JSON 4xx (never 500, never HTML), under both
  loaders.
- Names: run, tag, layer and metric names holding HTML/JS (and a URL hash
  holding some) render as text in the real tab; no script runs (a payload
  would set ``top.__xss``), no element or request comes from a payload, and
  the page raises no CSP violation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tensorboard.compat.proto import summary_pb2

from tb_introspect import metadata, slots, summary_pb
from tb_introspect.plugin import assets
from tb_introspect.plugin.http_io import RequestError
from tb_introspect.writer import NumpyWriter
from tests.browser.browser_support import launch_chromium, plugin_frame
from tests.browser.browser_support import stats_vector as fixture_vector
from tests.reliability import reliability_testlib as rl

# Every payload sets top.__xss if it ever runs as script.
EVIL_RUN = "<img src=x onerror=top.__xss=1>"
EVIL_NESTED_RUN = "\"'><script>top.__xss=2</script>"  # '/' makes it a nested folder
EVIL_LAYER = "<svg onload=top.__xss=3>"
EVIL_TENSOR = "\"><iframe srcdoc='<script>top.__xss=4</script>'>/kernel"
EVIL_OUTPUT_LAYER = "</title><img src=x onerror=top.__xss=5>"
EVIL_METRIC = "<b onmouseover=top.__xss=6>loss</b>"
TEMPLATE = "{{constructor.constructor('top.__xss=7')()}}${top.__xss=8}"
EVIL_NAMES = (EVIL_LAYER, EVIL_TENSOR, EVIL_OUTPUT_LAYER, EVIL_METRIC, TEMPLATE)

STEPS = 60
TENSORS = {  # (name, layer, depth, shape); output index 2 dies slowly -> a finding names it
    "variable": [(EVIL_TENSOR, EVIL_LAYER, 0, (8, 4)), (TEMPLATE + "/bias", TEMPLATE, 1, (4,))],
    "output": [(EVIL_LAYER, EVIL_LAYER, 0, (-1, 4)), (TEMPLATE, TEMPLATE, 1, (-1, 4)),
               (EVIL_OUTPUT_LAYER, EVIL_OUTPUT_LAYER, 2, (-1, 4))],
}
TENSORS["gradient"] = TENSORS["variable"]
TENSORS["output_gradient"] = TENSORS["output"]

# Sentinels of files outside static/: none may ever be served.
SECRETS = (b"root:x:0:0", b"def resolve(", b"setup(", b"[tool.ruff]")


def write_evil_run(run_dir: Path) -> None:
    with NumpyWriter(run_dir) as w:
        for step in range(1, STEPS + 1):
            s = summary_pb2.Summary()
            for view, tensors in TENSORS.items():
                for index, (name, layer, depth, shape) in enumerate(tensors):
                    vec = fixture_vector("x", view, index, step, shape)
                    s.value.extend(summary_pb.tensor_stats_pb(
                        vec, view=view, name=name, layer=layer, depth=depth, shape=shape).value)
            s.value.extend(summary_pb.metric_pb(EVIL_METRIC, 2.0 / step, (step - 1) // 20).value)
            w.add_summary(s, step, wall_time=1.7e9 + step)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("security") / "logs"
    write_evil_run(root / EVIL_RUN)
    write_evil_run(root / EVIL_NESTED_RUN)
    return root


@pytest.fixture(scope="module", params=rl.LOADERS, ids=["python-loader", "rust-loader"])
def tb(request, logdir):
    with rl.serve(logdir, request.param, wait_runs=2) as server:
        server.load_fast = request.param
        yield server


# ---------------------------------------------------------------------------- static route

TRAVERSALS = [
    "../plugin/assets.py",
    "../../setup.py",
    "../../pyproject.toml",
    "../../../../../../../../etc/passwd",
    "..%2fplugin%2fassets.py",
    "..%2F..%2Fsetup.py",
    "%2e%2e/plugin/assets.py",
    "%2e%2e%2fplugin%2fassets.py",
    ".%2e/plugin/assets.py",
    "%252e%252e%252fplugin%252fassets.py",
    "%25252e%25252e/plugin/assets.py",
    "..%5cplugin%5cassets.py",
    "..\\plugin\\assets.py",
    "..\\..\\setup.py",
    "%5c..%5c..%5csetup.py",
    "%c0%ae%c0%ae/plugin/assets.py",
    "%c0%af..%c0%afsetup.py",
    "%ef%bc%8e%ef%bc%8e/plugin/assets.py",
    "....//plugin/assets.py",
    "..;/plugin/assets.py",
    "index.js/../../plugin/assets.py",
    "index.js%00",
    "index.js%00.css",
    "%00../plugin/assets.py",
    "/etc/passwd",
    "%2fetc%2fpasswd",
    "//etc/passwd",
    "file:///etc/passwd",
    "C:\\Windows\\win.ini",
    "C:/Windows/win.ini",
    "~/.bashrc",
    "",
    ".",
    "..",
    "./",
    "a/" * 3000 + "index.js",
    "%" * 50,
    "%zz%",
    "index.js?../../setup.py",
    "index.js#../../setup.py",
]


def _check_no_leak(status: int, headers: dict, body: bytes, what: str) -> None:
    assert status < 500, (what, status, body[:300])
    for secret in SECRETS:
        assert secret not in body, (what, secret)


def test_static_route_serves_nothing_outside_its_folder(tb):
    host, port = "127.0.0.1", int(tb.url.split(":")[2].split("/")[0])
    prefixes = ["/data/plugin/introspect/static/", "/data/plugin/introspect/static%2f",
                "/data/plugin/introspect/"]
    answered = {}
    for prefix in prefixes:
        for path in TRAVERSALS:
            target = (prefix + path).encode("latin-1")
            status, headers, body = rl.raw_request(host, port, target)
            _check_no_leak(status, headers, body, target[:120])
            if status == 200:
                # Only real files of static/ (or the index module) may come back.
                assert body in _static_bodies(), (target[:120], body[:200])
            answered[target] = status
    # TensorBoard's own router in front of the plugin, and the other plugin routes.
    for target in ["/data/plugin/introspect/../../../../etc/passwd",
                   "/data/plugin/introspect/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                   "/data/plugin/introspect/index.js/../../../../setup.py",
                   "/data/plugin/introspect/runs/../static/../../setup.py",
                   "/data/plugin/%2e%2e/%2e%2e/setup.py",
                   "/data/plugin/introspect\\..\\..\\setup.py"]:
        status, headers, body = rl.raw_request(host, port, target.encode())
        _check_no_leak(status, headers, body, target)
        answered[target.encode()] = status
    # The real files are still served, as JavaScript that the browser will not sniff.
    status, headers, body = rl.raw_request(host, port, b"/data/plugin/introspect/static/index.js")
    assert status == 200 and body == (Path(assets.STATIC_DIR) / "index.js").read_bytes()
    assert headers["content-type"].startswith("text/javascript")
    assert headers.get("x-content-type-options") == "nosniff"
    counts = {s: sum(v == s for v in answered.values()) for s in sorted(set(answered.values()))}
    print(f"[load_fast={tb.load_fast}] {len(answered)} traversal requests: {counts}")


def _static_bodies() -> set[bytes]:
    out = {assets.FALLBACK_MODULE}
    for dirpath, _, files in os.walk(assets.STATIC_DIR):
        for f in files:
            out.add(Path(dirpath, f).read_bytes())
    return out


def test_resolve_refuses_symlinks_out_of_the_folder(tmp_path):
    root = tmp_path / "static"
    root.mkdir()
    (root / "ok.js").write_text("export {}")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, root / "link.js")
    os.symlink(tmp_path, root / "up")
    os.symlink("/etc", root / "etc")
    assert assets.resolve("ok.js", str(root)) == str((root / "ok.js").resolve())
    for bad in ("link.js", "up/secret.txt", "etc/passwd", "up", "../secret.txt",
                "ok.js/", "ok.js\x00", "\\ok.js", "/ok.js"):
        with pytest.raises(RequestError) as err:
            assets.resolve(bad, str(root))
        assert err.value.status == 404, bad


# ---------------------------------------------------------------------------- query parameters


def _evil_params() -> list[str]:
    run = rl.q(EVIL_RUN)
    tag = rl.q(metadata.stats_tag("gradient", EVIL_TENSOR))
    huge = "9" * 400
    return [
        # missing, empty, repeated, malformed
        "run", "run?", "run?run=", f"run?run={run}&run={run}", "run?run=%zz", "run?run=%",
        "run?run=%ff%fe%fd", "run?run=%00", "run?run=%c0%80", "run?run=a%00b",
        "run?run=" + "A" * 30000, "run?run=" + "%3Cscript%3E" * 2000,
        "run?run=%0d%0aSet-Cookie:%20pwned=1", "run?run=..%2f..%2f", "run?=&&&=&",
        "run?run[]=x", "run?RUN=" + run, f"run?run={run}&" + "&".join(["x=1"] * 3000),
        # series: tags and fields
        f"series?run={run}", f"series?run={run}&tag=", f"series?tag={tag}",
        f"series?run={run}&tag={tag}&field=nope", f"series?run={run}&tag={tag}&field=",
        f"series?run={run}&tag={tag}&field=" + "f" * 20000,
        f"series?run={run}" + "".join(f"&tag=t{i}" for i in range(800)),
        f"series?run={run}" + f"&tag={tag}" * 500,
        f"series?run={run}&tag={tag}" + "&field=rms" * 500,
        f"series?run={run}&tag=%00", f"series?run={run}&tag=" + "%ff" * 1000,
        # numbers: out of range, not numbers, odd spellings
        *(f"series?run={run}&tag={tag}&downsample={v}" for v in
          ("-1", huge, "-" + huge, "1e9", "nan", "inf", "0x10", "1_000", "%205", "%EF%BC%95",
           "1.5", "", "2147483648", "9223372036854775808", "18446744073709551616")),
        *(f"overview?run={run}&max_points={v}" for v in
          ("-1", huge, "1e9", "nan", "0x10", "1_000", "9223372036854775808", "1")),
        "overview", "overview?run=" + "%2e" * 5000,
    ]


def test_malformed_and_oversized_parameters_get_json_4xx(tb):
    statuses = {}
    for route in _evil_params():
        status, headers, body = rl.http_get(tb.plugin_url(route))
        statuses[route] = status
        assert status < 500, (route[:200], status, body[:300])
        assert "set-cookie" not in headers and "pwned" not in json.dumps(headers), route[:80]
        if status == 414 or status == 431:  # refused by the HTTP server itself
            continue
        # Answers are JSON, never HTML a browser would render, and never sniffed.
        assert headers["content-type"].startswith("application/json"), (route[:80], headers)
        assert headers.get("x-content-type-options") == "nosniff", (route[:80], headers)
        doc = json.loads(body)
        if status >= 400:
            assert set(doc) == {"error"} and isinstance(doc["error"], str), route[:80]
    counts = {s: sum(v == s for v in statuses.values()) for s in sorted(set(statuses.values()))}
    print(f"[load_fast={tb.load_fast}] {len(statuses)} malformed requests: {counts}")
    assert tb.process.poll() is None


# ---------------------------------------------------------------------------- names in the tab

CSP_AND_XSS_PROBE = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  (window.top.__cspViolations || window.__cspViolations).push(
    e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sample || ''));
});
"""

# Elements or attributes only a payload would create (TensorBoard's own
# plugin_entry.html has one inline module script, without the marker).
INJECTED_JS = """
() => document.querySelectorAll(
  'img, iframe, object, embed, [onerror], [onload], [onmouseover], [srcdoc]').length
  + Array.from(document.scripts).filter((s) => s.textContent.includes('__xss')).length
"""

HASH_PAYLOADS = [
    "p.introspect.run=" + rl.q("<img src=x onerror=top.__xss=11>"),
    "p.introspect.tab=" + rl.q("<img src=x onerror=top.__xss=12>"),
    "p.introspect.tab=layers&p.introspect.view=" + rl.q("\"><svg onload=top.__xss=13>")
    + "&p.introspect.focus=" + rl.q("<img src=x onerror=top.__xss=14>")
    + "&p.introspect.filter=" + rl.q("<img src=x onerror=top.__xss=15>"),
    "p.introspect.tab=compare&p.introspect.cmp=" + rl.q(json.dumps(
        ["<img src=x onerror=top.__xss=16>", EVIL_RUN, EVIL_NESTED_RUN]))
    + "&p.introspect.modes=" + rl.q('{"__proto__":{"polluted":1},"<img src=x>":"rms"}'),
]


@pytest.mark.browser
def test_html_in_names_and_url_renders_as_text_and_runs_nothing(logdir):
    from playwright.sync_api import sync_playwright

    # The loader TensorBoard picks by default when the data server is installed.
    with rl.serve(logdir, "true", wait_runs=2) as server, sync_playwright() as p:
        browser = launch_chromium(p)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.add_init_script(CSP_AND_XSS_PROBE)
        errors, requests, failed = [], [], []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        page.on("request", lambda r: requests.append(r.url))
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
        seen_text = set()

        def ready(frame):
            frame.wait_for_selector("html[data-status=ready]", timeout=30_000)

        def check(frame, where):
            ready(frame)
            assert page.evaluate("window.__xss") is None, where
            assert frame.evaluate("window.__xss") is None, where
            assert frame.evaluate(INJECTED_JS) == 0, where
            assert frame.evaluate("({}).polluted") is None, where
            assert page.evaluate("window.__cspViolations") == [], where
            seen_text.add(frame.evaluate("document.body.innerText"))

        try:
            for run in (EVIL_RUN, EVIL_NESTED_RUN):
                page.goto(server.url + "#introspect&p.introspect.run=" + rl.q(run))
                frame = plugin_frame(page)
                check(frame, f"overview of {run}")
                options = frame.locator(".run-select option").all_text_contents()
                assert sorted(options) == sorted([EVIL_RUN, EVIL_NESTED_RUN]), options
                for tab in ("layers", "activity", "compare", "overview"):
                    frame.locator(f'.tab[data-tab="{tab}"]').click()
                    check(frame, f"{tab} of {run}")
                    if tab == "layers":
                        for view in slots.VIEWS:
                            frame.locator(".view-select").select_option(view)
                            check(frame, f"layers/{view} of {run}")
                            names = frame.locator(".panel-name").all_text_contents()
                            want = {t[0] for t in TENSORS[view]}
                            assert want <= set(names), (view, names)
                    # Hover every chart: readouts name layers and runs.
                    for chart in frame.locator(".u-over").all()[:12]:
                        chart.scroll_into_view_if_needed()
                        box = chart.bounding_box()
                        if box:
                            page.mouse.move(box["x"] + box["width"] * 0.6,
                                            box["y"] + box["height"] * 0.5)
                    check(frame, f"hovered {tab} of {run}")
            for payload in HASH_PAYLOADS:
                page.goto(server.url + "#introspect&" + payload)
                frame = plugin_frame(page)
                check(frame, payload)
        finally:
            context.close()
            browser.close()

    text = "\n".join(seen_text)
    for name in (EVIL_RUN, EVIL_NESTED_RUN, EVIL_LAYER, EVIL_METRIC, EVIL_OUTPUT_LAYER,
                 EVIL_TENSOR, TEMPLATE):
        assert name in text, name  # shown, as the very characters of the name
    # No request came from a payload (an <img src=x> would fetch ./x).
    assert not [u for u in requests if u.rstrip("/").endswith("/x")], requests
    # TensorBoard's own page asks for fonts at an absolute /font-roboto/ path
    # (not ours, harmless); every other failed load or console error fails the test.
    fonts = [u for u in failed if "/font-roboto/" in u and "/plugin/" not in u]
    for _ in fonts:
        msg = next((e for e in errors if e.startswith("Failed to load resource")), None)
        if msg:
            errors.remove(msg)
    assert errors == [] and [u for u in failed if u not in fonts] == [], (errors, failed)
